// Where the engine tests train: on the CPU, or, with HPC_TRAIN_TEST_DEVICE=cuda (the
// gpu-labelled registrations, ctest -L gpu), on the GPU with the placement hpc_train itself
// chooses: NCCL for one rank, the MPI backend for several ranks sharing the one GPU.
#pragma once

#include <ATen/Context.h>
#include <mpi.h>

#include <cstdlib>
#include <string>

#include "hpc_train/config/config.h"
#include "hpc_train/runtime/placement.h"

namespace hpc_train::test_support {

inline bool testing_on_gpu() {
  const char* device = std::getenv("HPC_TRAIN_TEST_DEVICE");
  return device != nullptr && std::string(device) == "cuda";
}

// Sets config.device and returns the placement of a Trainer on `comm` (the ranks of one node).
inline Placement test_placement(TrainConfig& config, MPI_Comm comm) {
  if (!testing_on_gpu()) return Placement{};
  // TF32 convolutions would differ from the fp32 reference by far more than rounding.
  at::globalContext().setAllowTF32CuDNN(false);
  config.device = DeviceChoice::kCuda;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return resolve_placement(config, comm, probe_devices("localhost", rank));
}

// Relative difference allowed between parameters of runs that differ only in how the batch is
// split: float rounding on the CPU; on the GPU cuDNN also picks its algorithms by batch size.
inline double parameter_tolerance() { return testing_on_gpu() ? 1e-4 : 1e-5; }

}  // namespace hpc_train::test_support

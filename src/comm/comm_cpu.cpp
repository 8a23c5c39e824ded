// What a build without CUDA has in place of comm_nccl.cpp (comm.h, comm_backend.h): no NCCL.
// CMake picks one of the two.
#include "comm/comm_backend.h"
#include "hpc_train/comm/comm.h"
#include "hpc_train/error.h"

namespace hpc_train {

bool nccl_available() { return false; }

std::unique_ptr<CommBackend> make_nccl_backend(MPI_Comm, int) {
  throw ConfigError("--backend nccl: this hpc_train was built with a LibTorch without CUDA");
}

}  // namespace hpc_train

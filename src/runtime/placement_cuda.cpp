// probe_devices of a GPU build (placement.h): the GPUs LibTorch sees (CUDA_VISIBLE_DEVICES
// applies; none where the node has no GPU or driver) and the PCI bus id of the one this rank
// would take, which names that GPU alike for every rank of the node however each one's
// CUDA_VISIBLE_DEVICES numbers it.
#include <cuda_runtime.h>
#include <torch/cuda.h>

#include "hpc_train/runtime/cuda_check.h"
#include "hpc_train/runtime/placement.h"

namespace hpc_train {

RankDevices probe_devices(const std::string& host, int local_rank) {
  RankDevices mine;
  mine.host = host;
  mine.local_rank = local_rank;
  mine.visible_gpus = static_cast<int>(torch::cuda::device_count());
  if (mine.visible_gpus > 0) {
    char bus_id[64] = {};  // "0000:1b:00.0"; CUDA asks for at least 13 bytes
    CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id),
                                     choose_cuda_device(local_rank, mine.visible_gpus)));
    mine.bus_id = bus_id;
  }
  return mine;
}

}  // namespace hpc_train

// probe_devices of a CPU build (placement.h): LibTorch without CUDA sees no GPU.
#include "hpc_train/runtime/placement.h"

namespace hpc_train {

RankDevices probe_devices(const std::string& host, int local_rank) {
  RankDevices mine;
  mine.host = host;
  mine.local_rank = local_rank;
  return mine;
}

}  // namespace hpc_train

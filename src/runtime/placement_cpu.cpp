// probe_devices, gpu_memory and EarlyCudaStart of a CPU build (placement.h): LibTorch without
// CUDA sees no GPU, and nothing starts early.
#include "hpc_train/runtime/placement.h"

namespace hpc_train {

RankDevices probe_devices(const std::string& host, int local_rank) {
  RankDevices mine;
  mine.host = host;
  mine.local_rank = local_rank;
  return mine;
}

std::optional<GpuMemory> gpu_memory(const Placement&) { return std::nullopt; }

EarlyCudaStart::EarlyCudaStart(const TrainConfig*, torch::Dtype) {}
EarlyCudaStart::~EarlyCudaStart() = default;
std::string EarlyCudaStart::finish(const Placement&) { return ""; }

}  // namespace hpc_train

// probe_devices of a GPU build (placement.h): the GPUs LibTorch sees (CUDA_VISIBLE_DEVICES
// applies; none where the node has no GPU or driver) and the PCI bus id of the one this rank
// would take, which names that GPU alike for every rank of the node however each one's
// CUDA_VISIBLE_DEVICES numbers it. gpu_memory, and Note [Early CUDA start].
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/cuda.h>
#include <torch/torch.h>

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

std::optional<GpuMemory> gpu_memory(const Placement& placement) {
  if (!placement.cuda) return std::nullopt;
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(placement.cuda_device));
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return GpuMemory{static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
}

namespace {

// The thread's work (Note [Early CUDA start]); returns the GPU it started, -1 for none. Errors
// are left to the training thread, whose own first use of the GPU meets and reports them.
int start_cuda(int local_rank, torch::Dtype dtype) {
  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess || visible == 0) {
    cudaGetLastError();  // clear it for the training thread
    return -1;
  }
  const int device = choose_cuda_device(local_rank, visible);
  try {
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    if (cudaFree(nullptr) != cudaSuccess) return device;  // makes the context
    const auto options =
        torch::TensorOptions().dtype(dtype).device(torch::kCUDA, device).requires_grad(true);
    const auto nhwc = torch::MemoryFormat::ChannelsLast;
    const torch::Tensor x = torch::ones({2, 8, 8, 8}, options).contiguous(nhwc);
    const torch::Tensor weight = torch::ones({8, 8, 3, 3}, options).contiguous(nhwc);
    const torch::Tensor features = torch::conv2d(x, weight, {}, 1, 1).flatten(1);
    torch::linear(features, torch::ones({4, features.size(1)}, options)).sum().backward();
    c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).synchronize();
  } catch (const std::exception&) {
  }
  return device;
}

}  // namespace

EarlyCudaStart::EarlyCudaStart(const TrainConfig* config, torch::Dtype dtype) {
  if (!config || config->device == DeviceChoice::kCpu) return;
  const std::optional<int> local_rank = launcher_local_rank();
  if (!local_rank) return;
  // The trainer's setting, set ahead from the same command line: the thread's convolution reads
  // it, while the trainer, which sets it again, is being built.
  at::globalContext().setDeterministicCuDNN(config->deterministic);
  thread_ = std::thread([this, rank = *local_rank, dtype] { device_ = start_cuda(rank, dtype); });
}

EarlyCudaStart::~EarlyCudaStart() {
  if (thread_.joinable()) thread_.join();
}

std::string EarlyCudaStart::finish(const Placement& placement) {
  if (thread_.joinable()) thread_.join();
  if (device_ < 0 || (placement.cuda && placement.cuda_device == device_)) return "";
  return "CUDA was started early on GPU " + std::to_string(device_) +
         " (Note [Early CUDA start]), but this rank runs on " + placement.describe() +
         "; that GPU keeps an unused CUDA context until the job ends";
}

}  // namespace hpc_train

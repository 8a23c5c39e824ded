// The stall kernel of gpu_stall.h (a fault for tests).
#include "hpc_train/train/gpu_stall.h"

#include <cuda_runtime.h>

#include "hpc_train/runtime/cuda_check.h"

namespace hpc_train {
namespace {

// Nanoseconds of the GPU's global timer (PTX %globaltimer).
__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

__global__ void stall_kernel(unsigned long long duration_ns) {
  const unsigned long long start = global_timer_ns();
  while (global_timer_ns() - start < duration_ns) {
#if __CUDA_ARCH__ >= 700
    __nanosleep(1000000);  // 1 ms: the SM idles instead of spinning
#endif
  }
}

}  // namespace

void launch_gpu_stall(double seconds, cudaStream_t stream) {
  stall_kernel<<<1, 1, 0, stream>>>(static_cast<unsigned long long>(seconds * 1e9));
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace hpc_train

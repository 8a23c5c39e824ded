// fp32 to and from the model dtypes inside our kernels (fused_optimizer.cu, fused_batch_norm.cu):
// every sum and product in fp32, each stored value rounded to nearest even, as LibTorch's casts.
// CUDA code only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace hpc_train {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

}  // namespace hpc_train

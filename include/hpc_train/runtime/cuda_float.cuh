// fp32 to and from the model dtypes inside our kernels (the .cu files): every sum and product in
// fp32, each stored value rounded to nearest even, as LibTorch's casts; and the launchers' step
// from a KernelDtype to the kernel's C++ type. CUDA code only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "hpc_train/runtime/kernel_dtype.h"

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

// to_float and from_float as a type, for the per-thread functions that compile for the host too
// and take their conversions as a parameter (fused_pooling_items.h, input_items.h,
// cross_entropy_items.h): their kernels pass this one.
struct DeviceConvert {
  template <typename T>
  __device__ __forceinline__ static float to_float(T x) {
    return ::hpc_train::to_float(x);
  }
  template <typename T>
  __device__ __forceinline__ static T from_float(float x) {
    return ::hpc_train::from_float<T>(x);
  }
};

// Calls f with a value of `dtype`'s C++ type (float, __half, __nv_bfloat16), from host code.
template <typename F>
void with_element_type(KernelDtype dtype, F&& f) {
  switch (dtype) {
    case KernelDtype::kFloat32: f(float{}); return;
    case KernelDtype::kFloat16: f(__half{}); return;
    case KernelDtype::kBFloat16: f(__nv_bfloat16{}); return;
  }
}

}  // namespace hpc_train

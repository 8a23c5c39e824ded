// The fused pooling kernels (fused_pooling.h, Note [Fused pooling] in pool_bias_relu.h): a
// thread per item, the work of an item in fused_pooling_items.h, which test_kernel_items
// also runs on the CPU.
#include "hpc_train/model/fused_pooling.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "hpc_train/runtime/cuda_check.h"
#include "hpc_train/runtime/cuda_float.cuh"

namespace hpc_train {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    pool_bias_relu_forward_kernel(PoolShape shape, int64_t items, const T* __restrict__ x,
                                  const T* __restrict__ bias, T* __restrict__ y,
                                  uint8_t* __restrict__ window_index) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (item < items) pool_bias_relu_forward_item<T, DeviceConvert>(shape, item, x, bias, y, window_index);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    pool_bias_relu_backward_kernel(PoolShape shape, int64_t items, const T* __restrict__ dy,
                                   const T* __restrict__ y,
                                   const uint8_t* __restrict__ window_index, T* __restrict__ dx,
                                   T* __restrict__ dpooled) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (item < items) pool_bias_relu_backward_item<T, DeviceConvert>(shape, item, dy, y, window_index, dx, dpooled);
}

unsigned int blocks_for(int64_t items) {
  return static_cast<unsigned int>((items + kThreads - 1) / kThreads);
}

}  // namespace

bool fused_pooling_fits(const PoolShape& shape, KernelDtype dtype) {
  const int vector = 16 / element_bytes(dtype);
  return shape.channels > 0 && shape.channels % vector == 0 && shape.batch > 0 &&
         shape.pooled_height > 0 && shape.pooled_width > 0 &&
         shape.pooled_height == shape.height / 2 && shape.pooled_width == shape.width / 2;
}

void launch_pool_bias_relu_forward(const PoolShape& shape, KernelDtype dtype,
                                   const PoolForwardArgs& args, cudaStream_t stream) {
  with_element_type(dtype, [&](auto element) {
    using T = decltype(element);
    const int64_t items = pool_items<T>(shape);
    pool_bias_relu_forward_kernel<T><<<blocks_for(items), kThreads, 0, stream>>>(
        shape, items, static_cast<const T*>(args.x), static_cast<const T*>(args.bias),
        static_cast<T*>(args.y), args.window_index);
  });
  CUDA_CHECK(cudaGetLastError());
}

void launch_pool_bias_relu_backward(const PoolShape& shape, KernelDtype dtype,
                                    const PoolBackwardArgs& args, cudaStream_t stream) {
  with_element_type(dtype, [&](auto element) {
    using T = decltype(element);
    const int64_t items = pool_items<T>(shape);
    pool_bias_relu_backward_kernel<T><<<blocks_for(items), kThreads, 0, stream>>>(
        shape, items, static_cast<const T*>(args.dy), static_cast<const T*>(args.y),
        args.window_index, static_cast<T*>(args.dx), static_cast<T*>(args.dpooled));
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace hpc_train

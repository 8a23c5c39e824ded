// The fused pooling kernels (fused_pooling.h, Note [Fused pooling] in pool_bias_relu.h): a
// thread per item, the work of an item in fused_pooling_items.h, which test_kernel_items
// also runs on the CPU; the bias's gradient summed per block, then over the blocks.
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

// The backward kernel's blocks cover whole pixels: kThreads / vectors of them, `vectors` (the
// channels' 16-byte vectors) threads each, so that thread t of every block holds channel vector
// t % vectors. Threads past the block's pixels idle.
struct BackwardBlocks {
  int vectors;           // per pixel
  int lanes;             // pixels per block
  int64_t items_per_block, blocks;
};

template <typename T>
__host__ __device__ BackwardBlocks backward_blocks(const PoolShape& shape) {
  BackwardBlocks b;
  b.vectors = static_cast<int>(shape.channels / kPoolVectorElements<T>);
  b.lanes = kThreads / b.vectors;
  b.items_per_block = static_cast<int64_t>(b.lanes) * b.vectors;
  b.blocks = (pool_items<T>(shape) + b.items_per_block - 1) / b.items_per_block;
  return b;
}

// Each block: its items' backward, then its pixels' sums of the bias's terms per channel (a tree
// over the lanes in shared memory, a fixed order) into partials[block][channel].
template <typename T>
__global__ void __launch_bounds__(kThreads)
    pool_bias_relu_backward_kernel(PoolShape shape, int64_t items, const T* __restrict__ dy,
                                   const T* __restrict__ y,
                                   const uint8_t* __restrict__ window_index, T* __restrict__ dx,
                                   float* __restrict__ partials) {
  constexpr int V = kPoolVectorElements<T>;
  __shared__ float sums[V][kThreads];  // [channel of the vector][thread]: no bank conflicts
  const BackwardBlocks b = backward_blocks<T>(shape);
  const int lane = static_cast<int>(threadIdx.x) / b.vectors;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * b.items_per_block + threadIdx.x;
  float terms[V];
  for (int i = 0; i < V; ++i) terms[i] = 0.f;
  if (lane < b.lanes && item < items)
    pool_bias_relu_backward_item<T, DeviceConvert>(shape, item, dy, y, window_index, dx, terms);
  for (int i = 0; i < V; ++i) sums[i][threadIdx.x] = terms[i];
  for (int stride = 1; stride < b.lanes; stride *= 2) {
    __syncthreads();
    if (lane % (2 * stride) == 0 && lane + stride < b.lanes)
      for (int i = 0; i < V; ++i) sums[i][threadIdx.x] += sums[i][threadIdx.x + stride * b.vectors];
  }
  if (lane == 0)
    for (int i = 0; i < V; ++i)
      partials[blockIdx.x * shape.channels + threadIdx.x * V + i] = sums[i][threadIdx.x];
}

// The bias's gradient: per channel, a warp adds the blocks' partials (its lanes strided, then a
// shuffle tree: a fixed order) and rounds once to T.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    bias_gradient_finish_kernel(int64_t channels, int64_t blocks,
                                const float* __restrict__ partials, T* __restrict__ bias_grad) {
  constexpr int kWarp = 32;
  const int64_t channel =
      static_cast<int64_t>(blockIdx.x) * (kThreads / kWarp) + threadIdx.x / kWarp;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  if (channel >= channels) return;  // the whole warp: its lanes share the channel
  float sum = 0.f;
  for (int64_t block = lane; block < blocks; block += kWarp)
    sum += partials[block * channels + channel];
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    sum += __shfl_down_sync(0xffffffffu, sum, offset);
  if (lane == 0) bias_grad[channel] = DeviceConvert::template from_float<T>(sum);
}

unsigned int blocks_for(int64_t items) {
  return static_cast<unsigned int>((items + kThreads - 1) / kThreads);
}

}  // namespace

bool fused_pooling_fits(const PoolShape& shape, KernelDtype dtype) {
  const int vector = 16 / element_bytes(dtype);
  // A backward block holds at least one pixel's channels.
  return shape.channels > 0 && shape.channels % vector == 0 &&
         shape.channels / vector <= kThreads && shape.batch > 0 &&
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

int64_t pool_backward_partials(const PoolShape& shape, KernelDtype dtype) {
  int64_t partials = 0;
  with_element_type(dtype, [&](auto element) {
    partials = backward_blocks<decltype(element)>(shape).blocks * shape.channels;
  });
  return partials;
}

void launch_pool_bias_relu_backward(const PoolShape& shape, KernelDtype dtype,
                                    const PoolBackwardArgs& args, cudaStream_t stream) {
  with_element_type(dtype, [&](auto element) {
    using T = decltype(element);
    const BackwardBlocks b = backward_blocks<T>(shape);
    pool_bias_relu_backward_kernel<T><<<static_cast<unsigned int>(b.blocks), kThreads, 0, stream>>>(
        shape, pool_items<T>(shape), static_cast<const T*>(args.dy), static_cast<const T*>(args.y),
        args.window_index, static_cast<T*>(args.dx), args.partials);
    CUDA_CHECK(cudaGetLastError());
    // A warp per channel.
    bias_gradient_finish_kernel<T><<<blocks_for(shape.channels * 32), kThreads, 0, stream>>>(
        shape.channels, b.blocks, args.partials, static_cast<T*>(args.bias_grad));
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace hpc_train

// The fused pooling kernels (src/model/fused_pooling.cu; Note [Fused pooling] in
// pool_bias_relu.h): relu(max_pool2d(x, 2) + bias) on channels-last activations, forward and
// backward, one item per thread (fused_pooling_items.h says what an item is and does).
//
// Torch-free: raw device pointers and sizes. Needs the CUDA runtime's headers, so only
// GPU-build code includes it; pool_bias_relu.h is the model's side.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "hpc_train/model/fused_pooling_items.h"
#include "hpc_train/runtime/kernel_dtype.h"

namespace hpc_train {

// Whether the kernels take this shape: channels a multiple of the 16-byte vector (8 at 16 bits,
// 4 at 32) and at most 256 vectors (a backward block holds a pixel's), at least one pooled
// pixel.
bool fused_pooling_fits(const PoolShape& shape, KernelDtype dtype);

struct PoolForwardArgs {
  const void* x = nullptr;        // [N, H, W, C], 16-byte aligned
  const void* bias = nullptr;     // [C], the same dtype
  void* y = nullptr;              // [N, C, H/2, W/2] at the shape's output strides
  uint8_t* window_index = nullptr;  // [N, H/2, W/2, C] out: each channel's argmax, 0..3
};
void launch_pool_bias_relu_forward(const PoolShape& shape, KernelDtype dtype,
                                   const PoolForwardArgs& args, cudaStream_t stream);

struct PoolBackwardArgs {
  const void* dy = nullptr;       // like the forward's y
  const void* y = nullptr;        // the forward's output (the ReLU's mask)
  const uint8_t* window_index = nullptr;
  void* dx = nullptr;             // [N, H, W, C] out; an odd last row or column is not written
  void* bias_grad = nullptr;      // [C] out, the bias's dtype: dy masked by the ReLU, summed
  float* partials = nullptr;      // pool_backward_partials(shape, dtype) floats of workspace
};
// The backward's workspace: each block's per-channel sums of the bias's terms.
int64_t pool_backward_partials(const PoolShape& shape, KernelDtype dtype);
// Two kernels: the items' backward with each block's bias sums, then the sums over the blocks
// (a fixed order: a replay or a rerun gives the same bits).
void launch_pool_bias_relu_backward(const PoolShape& shape, KernelDtype dtype,
                                    const PoolBackwardArgs& args, cudaStream_t stream);

}  // namespace hpc_train

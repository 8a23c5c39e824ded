// relu(max_pool2d(x, 2) + bias): simple_cnn's pooling with its convolution's bias and ReLU after
// it (Note [Pool before bias] in models.cpp).
//
// Note [Fused pooling]
// LibTorch runs it as four kernels forward (max pooling writing 8-byte indices, the bias's add,
// the ReLU) and four backward (the ReLU's mask, the bias's reduction, max pooling's scatter
// into a zeroed input gradient), and its NHWC max pooling was slow enough that simple_cnn ran
// NCHW, with cuDNN converting NCHW to NHWC and back around every convolution, a sizeable share
// of a step's kernel time (bench/results-notes.md, Note [Fused pooling]). On a GPU, with
// channels-last activations, one kernel of ours does the forward (a 1-byte window argmax per
// output element kept for backward) and two the backward (the ReLU's mask, the argmax's scatter
// and each block's per-channel sums of the masked gradient; then the bias's gradient, those sums
// added in a fixed order, where LibTorch's sum of a pooled-size masked gradient took two
// reduction kernels of its own in simple_cnn's step): fused_pooling.cu, one thread per 16 bytes
// of an output pixel's channels (fused_pooling_items.h). The values are LibTorch's, bit for bit:
// the same maximum (first in a tie, NaN wins), one fp32 add rounded once, the same masks; only the
// bias's sum may add in another order. The pooled output may be asked NCHW (`pooled_format`), so
// that a flatten after it is a view. Everywhere else, and under set_fused_pooling(false)
// (--fused-pooling off), LibTorch's ops run.
#pragma once

#include <c10/core/MemoryFormat.h>
#include <torch/types.h>

namespace hpc_train {

// x [N, C, H, W], bias [C]. `pooled_format`: the fused path's output layout (LibTorch's ops
// choose their own).
torch::Tensor max_pool_bias_relu(const torch::Tensor& x, const torch::Tensor& bias,
                                 at::MemoryFormat pooled_format = at::MemoryFormat::ChannelsLast);

// Process-wide, as set_fused_batch_norm (the trainer sets it from the configuration). On by
// default.
void set_fused_pooling(bool enabled);

// Whether max_pool_bias_relu would run the fused kernels for these inputs (the tests ask);
// false in a build without CUDA.
bool fused_pooling_applies(const torch::Tensor& x, const torch::Tensor& bias);

namespace detail {
// The build's fused path (pool_bias_relu_cuda.cpp, pool_bias_relu_cpu.cpp).
bool fused_pooling_takes(const torch::Tensor& x, const torch::Tensor& bias);
torch::Tensor fused_max_pool_bias_relu(const torch::Tensor& x, const torch::Tensor& bias,
                                       at::MemoryFormat pooled_format);
}  // namespace detail

}  // namespace hpc_train

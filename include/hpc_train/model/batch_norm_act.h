// A batch norm and what follows it in a ResNet: relu(bn(x) + residual), the ReLU and the
// residual each optional. The zoo's networks call this where LibTorch's modules would be
// chained (the ResNets of models_resnet.cpp); the BatchNorm2d module keeps its parameters,
// buffers and state_dict names.
//
// In training mode on a GPU, with channels-last activations, it runs the fused kernels of
// fused_batch_norm.h (Note [Fused batch norm]) unless set_fused_batch_norm(false) (the
// --fused-batch-norm switch); everywhere else, and in evaluation, LibTorch's batch norm, add and
// ReLU, as the modules would run them.
#pragma once

#include <torch/nn/modules/batchnorm.h>
#include <torch/types.h>

namespace hpc_train {

enum class Activation { kNone, kRelu };

// `residual` may be undefined: none. Batch norm's own effects are kept: the running statistics
// and num_batches_tracked advance in training mode.
torch::Tensor batch_norm_act(const torch::Tensor& x, torch::nn::BatchNorm2dImpl& bn,
                             const torch::Tensor& residual, Activation activation);

// Process-wide, as cuDNN's own switches (the trainer sets it from the configuration). On by
// default.
void set_fused_batch_norm(bool enabled);

// Whether batch_norm_act would run the fused kernels for these inputs (the tests ask); false in
// a build without CUDA.
bool fused_batch_norm_applies(const torch::Tensor& x, const torch::nn::BatchNorm2dImpl& bn,
                              const torch::Tensor& residual);

namespace detail {
// The build's fused path (batch_norm_act_cuda.cpp, batch_norm_act_cpu.cpp): whether the kernels
// take these inputs, and the fused forward with its autograd node.
bool fused_kernels_take(const torch::Tensor& x, const torch::nn::BatchNorm2dImpl& bn,
                        const torch::Tensor& residual);
torch::Tensor fused_batch_norm_act(const torch::Tensor& x, torch::nn::BatchNorm2dImpl& bn,
                                   const torch::Tensor& residual, Activation activation);
}  // namespace detail

}  // namespace hpc_train

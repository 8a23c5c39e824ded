// batch_norm_act (batch_norm_act.h): the choice between the fused kernels and LibTorch's ops.
#include "hpc_train/model/batch_norm_act.h"

#include <torch/torch.h>

#include <atomic>

namespace hpc_train {

namespace {
std::atomic<bool> fused_enabled{true};
}  // namespace

void set_fused_batch_norm(bool enabled) { fused_enabled = enabled; }

bool fused_batch_norm_applies(const torch::Tensor& x, const torch::nn::BatchNorm2dImpl& bn,
                              const torch::Tensor& residual) {
  // Evaluation is not fused: it is not the step, and it reads the running statistics instead.
  // A cumulative average (no momentum) would read num_batches_tracked back to the host.
  return fused_enabled && bn.is_training() && bn.options.track_running_stats() &&
         bn.options.affine() && bn.options.momentum().has_value() &&
         detail::fused_kernels_take(x, bn, residual);
}

torch::Tensor batch_norm_act(const torch::Tensor& x, torch::nn::BatchNorm2dImpl& bn,
                             const torch::Tensor& residual, Activation activation) {
  if (fused_batch_norm_applies(x, bn, residual))
    return detail::fused_batch_norm_act(x, bn, residual, activation);
  torch::Tensor y = bn.forward(x);
  if (residual.defined()) y = y + residual;
  return activation == Activation::kRelu ? torch::relu(y) : y;
}

}  // namespace hpc_train

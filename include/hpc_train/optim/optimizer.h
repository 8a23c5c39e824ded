// The update rules, elementwise, on flat fp32 tensors, with torch.optim's arithmetic:
//   adam    Adam / AdamW (bias-corrected moments; AdamW decays the weights directly, Adam adds
//           weight_decay * p to the gradient)
//   sgd     SGD with momentum, dampening and Nesterov's variant; weight decay as an L2 term, as
//           torch.optim.SGD (its momentum buffer starts as the first step's gradient)
// The ZeRO optimizer (zero_optimizer.h) applies them to this rank's partition; the fused GPU
// step (fused_optimizer.h) does the same arithmetic in its kernels.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "hpc_train/config/config_choices.h"

namespace hpc_train {

struct OptimizerOptions {
  double lr = 1e-3;  // the base rate; a schedule may pass another one to the updates
  double beta1 = 0.9;    // Adam
  double beta2 = 0.999;  // Adam
  double eps = 1e-8;     // Adam
  double weight_decay = 0.01;
  OptimizerKind kind = OptimizerKind::kAdamW;
  double momentum = 0.0;   // SGD; 0 = plain SGD, no buffer
  double dampening = 0.0;  // SGD
  bool nesterov = false;   // SGD

  bool decoupled_weight_decay() const { return kind == OptimizerKind::kAdamW; }
  bool adam() const { return kind != OptimizerKind::kSgd; }
};

// The optimizer state a rule keeps per parameter element (fp32 each, besides master weights):
// Adam's two moments, SGD's momentum buffer where it has one. `cycled_momentum`: a schedule
// sets the momentum (Note [Cycled momentum] in lr_schedule.h), so SGD needs its buffer even at
// --momentum 0.
int state_buffers(const OptimizerOptions& options, bool cycled_momentum);

// One Adam/AdamW update of `parameters` (fp32, in place) from `grads`, with moments `exp_avg`
// and `exp_avg_sq` (updated in place); `step` counts from 1. All four are the same shape.
// `beta1` replaces options.beta1 (a one-cycle schedule cycles it), the bias correction included.
// `decay_mask` (bool, the same shape; undefined: every element): the elements weight decay
// applies to (--no-decay-bias-bn), as a torch parameter group without decay leaves the others.
void adam_update(at::Tensor parameters, const at::Tensor& grads, at::Tensor exp_avg,
                 at::Tensor exp_avg_sq, int64_t step, double lr, double beta1,
                 const OptimizerOptions& options, const at::Tensor& decay_mask = {});

// One SGD update of `parameters` from `grads`, with `momentum_buffer` (undefined when the run
// keeps none); `step` counts from 1: on step 1 the buffer becomes the gradient, as torch's does.
// `momentum` replaces options.momentum (a one-cycle schedule cycles it); `decay_mask` as above.
void sgd_update(at::Tensor parameters, const at::Tensor& grads, at::Tensor momentum_buffer,
                int64_t step, double lr, double momentum, const OptimizerOptions& options,
                const at::Tensor& decay_mask = {});

}  // namespace hpc_train

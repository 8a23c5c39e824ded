// Adam and AdamW, elementwise, on flat fp32 tensors: the same arithmetic as torch.optim.Adam /
// AdamW (bias-corrected moments; AdamW decays the weights directly, Adam adds
// weight_decay * p to the gradient). The ZeRO optimizer (zero_optimizer.h) applies it to this
// rank's partition.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "hpc_train/config/config_choices.h"

namespace hpc_train {

struct AdamOptions {
  double lr = 1e-3;  // the base rate; a schedule may pass another one to adam_update
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  bool decoupled_weight_decay = true;  // true: AdamW, false: Adam with L2 penalty
};

// --optimizer's options with those hyper-parameters.
AdamOptions adam_options(OptimizerKind optimizer, double lr, double beta1, double beta2,
                         double eps, double weight_decay);

// One update of `parameters` (fp32, in place) from `grads`, with moments `exp_avg` and
// `exp_avg_sq` (updated in place); `step` counts from 1. All four are the same shape.
void adam_update(at::Tensor parameters, const at::Tensor& grads, at::Tensor exp_avg,
                 at::Tensor exp_avg_sq, int64_t step, double lr, const AdamOptions& options);

}  // namespace hpc_train

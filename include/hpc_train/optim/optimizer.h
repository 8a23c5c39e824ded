// The update rules, elementwise, on flat fp32 tensors, with torch.optim's arithmetic:
//   adam    Adam / AdamW (bias-corrected moments; AdamW decays the weights directly, Adam adds
//           weight_decay * p to the gradient)
//   sgd     SGD with momentum, dampening and Nesterov's variant; weight decay as an L2 term, as
//           torch.optim.SGD (its momentum buffer starts as the first step's gradient)
//   lamb    Adam's moments, then each parameter's step scaled by a trust ratio (Note [Trust
//           ratios])
//   lars    SGD's momentum, each parameter's gradient first scaled by a trust ratio
// The ZeRO optimizer (zero_optimizer.h) applies them to this rank's partition; the fused GPU
// step (fused_optimizer.h) does the same arithmetic in its kernels.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "hpc_train/config/config_choices.h"
#include "hpc_train/optim/trust_ratio.h"

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
  bool nesterov = false;   // SGD, LARS
  double trust_coefficient = 1e-3;  // LARS: eta in eta x |w| / (|g| + weight_decay x |w|)
  double min_trust_ratio = 0.0;     // LAMB: the ratio's bounds (DeepSpeed's min_coeff, max_coeff);
  double max_trust_ratio = 0.0;     //   0 = no upper bound
  LambBiasCorrection lamb_bias_correction = LambBiasCorrection::kMoments;  // LAMB

  bool decoupled_weight_decay() const { return kind == OptimizerKind::kAdamW; }
  // Adam's moments (Adam, AdamW, LAMB); otherwise SGD's momentum buffer (SGD, LARS).
  bool adam() const { return keeps_adam_moments(kind); }
  // The step of each parameter is scaled by its trust ratio (Note [Trust ratios]).
  bool layer_adaptive() const { return kind == OptimizerKind::kLamb || kind == OptimizerKind::kLars; }
};

// Note [Trust ratios]
// LAMB and LARS scale each parameter's step by a ratio of norms over the whole parameter (a
// weight tensor, a bias), so that every layer moves by about the same fraction of its weights:
//  - LAMB (You et al., "Large Batch Optimization for Deep Learning", Algorithm 2): Adam's moments
//    m, v move as Adam's do; the direction is u = (m / bc1) / (sqrt(v) / sqrt(bc2) + eps) +
//    wd x w, bc1 = 1 - beta1^t and bc2 = 1 - beta2^t (wd where weight decay applies); then
//    w -= lr x r x u with r = |w| / |u|. Every parameter adapts, biases too, as in the paper and
//    DeepSpeed's FusedLamb. FusedLamb differs in where the bias is corrected: its direction is
//    m / (sqrt(v) + eps) + wd x w, and the correction goes into the step, lr x sqrt(bc2) / bc1
//    (--lamb-bias-correction step; "none" drops it), which changes the first ~1 / (1 - beta2)
//    steps. FusedLamb bounds r to [min_coeff, max_coeff] = [0.01, 10] by default; here
//    --min-trust-ratio and --max-trust-ratio do, and are off by default, as in the paper.
//  - LARS (You et al., "Large Batch Training of Convolutional Networks"; as timm's Lars):
//    r = eta x |w| / (|g| + wd x |w| + eps), eta the trust coefficient; the direction
//    r x (g + wd x w) then goes through SGD's momentum (and Nesterov's variant), w -= lr x d.
//    Parameters below 2-D (biases, BatchNorm's) do not adapt (r = 1), as usual for LARS.
// In both, r = 1 where |w| or the other norm is 0 (a parameter at zero, no gradient). The norms
// are over the whole parameter, but ZeRO's partitions split parameters between ranks: each rank
// sums the squares of its pieces of each parameter (in fp64), and one all-reduce of two numbers
// per parameter adds them up before any weight moves.

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

// LAMB's first half on one parameter's elements (Note [Trust ratios]): moves Adam's moments in
// place (`beta1` as in adam_update) and returns the direction u; `decays`: weight decay applies.
at::Tensor lamb_direction(const at::Tensor& parameters, const at::Tensor& grads,
                          at::Tensor exp_avg, at::Tensor exp_avg_sq, double beta1,
                          const LambCorrection& correction, const OptimizerOptions& options,
                          bool decays);

// One LARS update of one parameter's elements, given its trust ratio: the direction
// trust_ratio x (grads + weight_decay x parameters) through SGD's momentum, as sgd_update's.
// `weight_decay`: this parameter's (0 where none applies).
void lars_update(at::Tensor parameters, const at::Tensor& grads, at::Tensor momentum_buffer,
                 int64_t step, double lr, double momentum, const OptimizerOptions& options,
                 double weight_decay, double trust_ratio);

}  // namespace hpc_train

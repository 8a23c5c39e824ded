// The per-parameter scalars of LAMB and LARS (Note [Trust ratios] in optimizer.h), as functions
// that compile for the host and the GPU: ZeroOptimizer's CPU step and the fused GPU step
// (fused_optimizer.cu) take their ratios and LAMB's bias correction from here, so the two
// cannot drift apart.
#pragma once

#include <cmath>
#include <cstdint>

#include "hpc_train/optim/lr_schedule.h"  // HPC_TRAIN_HOST_DEVICE

namespace hpc_train {

// --lamb-bias-correction; its names are in config_choices.h.
enum class LambBiasCorrection : int32_t { kMoments, kStepSize, kNone };

// LAMB's direction is (m x moment_scale) / (sqrt(v) x root_scale + eps) + wd x w, and its step
// -lr x step_scale x ratio x direction: the bias correction in the moments (the paper:
// 1 / bc1, 1 / sqrt(bc2), 1), in the step (DeepSpeed's FusedLamb: 1, 1, sqrt(bc2) / bc1), or
// none (1, 1, 1). bc1 = 1 - beta1^step, bc2 = 1 - beta2^step; `step` counts from 1.
struct LambCorrection {
  double moment_scale = 1.0;
  double root_scale = 1.0;
  double step_scale = 1.0;
};

HPC_TRAIN_HOST_DEVICE inline LambCorrection lamb_correction(LambBiasCorrection where, double beta1,
                                                            double beta2, int64_t step) {
  const double bias_correction1 = 1.0 - pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - pow(beta2, static_cast<double>(step));
  LambCorrection c;
  if (where == LambBiasCorrection::kMoments) {
    c.moment_scale = 1.0 / bias_correction1;
    c.root_scale = 1.0 / sqrt(bias_correction2);
  } else if (where == LambBiasCorrection::kStepSize) {
    c.step_scale = sqrt(bias_correction2) / bias_correction1;
  }
  return c;
}

// LAMB: |w| / |u|, within [min_ratio, max_ratio] (max_ratio 0: no upper bound); 1 where either
// norm is 0.
HPC_TRAIN_HOST_DEVICE inline double lamb_trust_ratio(double weight_norm, double direction_norm,
                                                     double min_ratio, double max_ratio) {
  if (!(weight_norm > 0.0 && direction_norm > 0.0)) return 1.0;
  double ratio = weight_norm / direction_norm;
  if (max_ratio > 0.0 && ratio > max_ratio) ratio = max_ratio;
  if (ratio < min_ratio) ratio = min_ratio;
  return ratio;
}

// LARS: eta x |w| / (|g| + wd x |w| + eps), wd this parameter's weight decay (0 where none
// applies); 1 where either norm is 0, and for a parameter that does not adapt (below 2-D).
HPC_TRAIN_HOST_DEVICE inline double lars_trust_ratio(double weight_norm, double grad_norm,
                                                     double trust_coefficient,
                                                     double weight_decay, double eps) {
  if (!(weight_norm > 0.0 && grad_norm > 0.0)) return 1.0;
  return trust_coefficient * weight_norm / (grad_norm + weight_decay * weight_norm + eps);
}

}  // namespace hpc_train

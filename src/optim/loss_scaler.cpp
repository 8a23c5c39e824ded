// The fp16 loss scaler: DeepSpeed's DynamicLossScaler.update_scale, step for step, so that a run
// brought over from DeepSpeed skips the same steps and uses the same scales.
//
// Note [Loss scale window]: the scale doubles on a clean step whose distance from the last
// overflow is a multiple of the window: (steps - last_overflow_step) % window == 0. With
// last_overflow_step = -1 at the start, the first doubling happens on step window - 1 (0-based),
// i.e. after `window` clean steps; after an overflow on step k, on step k + window. Counting from
// the last overflow (not from the last doubling) is DeepSpeed's rule; with no further overflow
// the scale keeps doubling every `window` steps.
#include "hpc_train/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "hpc_train/error.h"

namespace hpc_train {
namespace {

std::string format_scale(double scale) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", scale);
  return text;
}

}  // namespace

std::string loss_scale_exhausted(double min_scale, int64_t step, int64_t skipped_steps) {
  return "fp16 loss scale is already at its minimum (" + format_scale(min_scale) +
         ") and the gradients still overflow: optimizer step " + std::to_string(step) +
         " overflowed again (" + std::to_string(skipped_steps) +
         " step(s) skipped so far), so the loss or the gradients are inf/nan even barely "
         "scaled. What to try: --precision bf16 (fp32's range, no loss scale), a lower --lr, "
         "gradient clipping (--clip-grad 1.0), or --precision fp32 to see where it diverges";
}

LossScaler::LossScaler(const LossScalerOptions& options)
    : options_(options),
      scale_(options.fixed_scale > 0 ? options.fixed_scale
                                     : std::ldexp(1.0, options.initial_scale_power)),
      hysteresis_left_(options.hysteresis) {
  // validate() checks these for the command line; a scaler built some other way must not divide
  // by a zero window or count hysteresis down past zero.
  if (!(std::isfinite(options.fixed_scale) && options.fixed_scale >= 0)) {
    throw ConfigError("--loss-scale " + format_scale(options.fixed_scale) +
                      ": must be 0 (dynamic) or a fixed scale > 0");
  }
  if (options.fixed_scale > 0) return;  // the dynamic options play no part
  if (options.initial_scale_power < 0 || options.initial_scale_power > 64) {
    throw ConfigError("--initial-scale-power " + std::to_string(options.initial_scale_power) +
                      ": must be in [0, 64]");
  }
  if (options.scale_window < 1) {
    throw ConfigError("--loss-scale-window " + std::to_string(options.scale_window) +
                      ": must be at least 1");
  }
  if (options.hysteresis < 1) {
    throw ConfigError("--hysteresis " + std::to_string(options.hysteresis) +
                      ": must be at least 1");
  }
  if (!(std::isfinite(options.min_scale) && options.min_scale > 0)) {
    throw ConfigError("--min-loss-scale " + format_scale(options.min_scale) +
                      ": must be a finite number > 0");
  }
}

bool LossScaler::update(bool overflow) {
  if (options_.fixed_scale > 0) {
    // A static scale: an overflowed step is skipped and nothing else changes (DeepSpeed's
    // LossScaler); it never gives up, since halving is not on offer.
    ++steps_;
    if (overflow) ++skipped_steps_;
    return overflow;
  }
  if (overflow) {
    if (hysteresis_left_ <= 1) {
      if (scale_ == options_.min_scale) {
        throw Error(loss_scale_exhausted(scale_, steps_, skipped_steps_ + 1));
      }
      scale_ = std::max(scale_ / 2, options_.min_scale);
      // hysteresis_left_ stays at 1: until a whole window passes cleanly, every further
      // overflow halves again (DeepSpeed resets it only when the scale grows).
    } else {
      --hysteresis_left_;
    }
    last_overflow_step_ = steps_;
    ++skipped_steps_;
  } else if ((steps_ - last_overflow_step_) % options_.scale_window == 0) {
    // Note [Loss scale window]
    hysteresis_left_ = options_.hysteresis;
    scale_ *= 2;
  }
  ++steps_;
  return overflow;
}

LossScalerState LossScaler::state() const {
  return {scale_, hysteresis_left_, steps_, last_overflow_step_, skipped_steps_};
}

void LossScaler::restore(const LossScalerState& state) {
  scale_ = state.scale;
  hysteresis_left_ = state.hysteresis_left;
  steps_ = state.steps;
  last_overflow_step_ = state.last_overflow_step;
  skipped_steps_ = state.skipped_steps;
}

}  // namespace hpc_train

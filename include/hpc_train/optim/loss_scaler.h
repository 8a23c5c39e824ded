// The fp16 loss scaler, with DeepSpeed's meaning and defaults: the loss is multiplied by
// `scale()` before backward so that small gradients survive fp16; a step whose gradients
// overflowed (inf/nan on any rank: the caller agrees on it first) is skipped.
//
// Dynamic scaling (DeepSpeed's DynamicLossScaler): starts at 2^initial_scale_power. On an
// overflow, the hysteresis counter absorbs the first (hysteresis - 1) overflows; after that the
// scale halves (not below min_loss_scale), and an overflow at min_loss_scale is an error. After
// loss_scale_window steps without overflow since the last one, the scale doubles and the
// hysteresis counter is reset. A fixed scale (loss_scale > 0) never changes; its overflowed
// steps are still skipped.
#pragma once

#include <cstdint>
#include <string>

namespace hpc_train {

struct LossScalerOptions {
  double fixed_scale = 0.0;      // > 0: a static scale
  int initial_scale_power = 16;
  int scale_window = 1000;
  int hysteresis = 2;
  double min_scale = 1.0;
};

// Everything a scaler has learnt, for checkpoints (and for a copy kept on the GPU).
struct LossScalerState {
  double scale = 1.0;
  int hysteresis_left = 0;
  int64_t steps = 0;
  int64_t last_overflow_step = -1;
  int64_t skipped_steps = 0;
};

// The error of a dynamic scale that overflowed at `min_scale` (at optimizer step `step`, with
// `skipped_steps` skipped so far, that one included): what to try instead. The host scaler
// (update) and the device one (ZeroOptimizer::report) stop the run with it.
std::string loss_scale_exhausted(double min_scale, int64_t step, int64_t skipped_steps);

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& options);

  double scale() const { return scale_; }
  // Records one optimizer step's outcome; returns true when the step must be skipped.
  // Throws Error when an overflow happens at the minimum scale (training cannot continue).
  bool update(bool overflow);

  int64_t steps() const { return steps_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  int hysteresis_left() const { return hysteresis_left_; }
  const LossScalerOptions& options() const { return options_; }

  LossScalerState state() const;
  // Continues from `state` (a checkpoint's): the next update behaves as the saved scaler's would.
  void restore(const LossScalerState& state);

 private:
  LossScalerOptions options_;
  double scale_;
  int hysteresis_left_;
  int64_t steps_ = 0;
  int64_t last_overflow_step_ = -1;
  int64_t skipped_steps_ = 0;
};

}  // namespace hpc_train

// Learning-rate schedules, as functions of the optimizer step (0-based):
//   constant       lr
//   warmup         warm-up from warmup_start_ratio * lr to lr over warmup_steps, then lr
//                  (DeepSpeed's WarmupLR)
//   warmup-cosine  the same warm-up, then a cosine from lr down to cosine_final_ratio * lr at
//                  total_steps (DeepSpeed's WarmupCosineLR)
// The warm-up is linear (step / warmup_steps) or logarithmic (log(step + 1) / log(warmup_steps),
// DeepSpeed's default).
//
// Note [Schedule step]: the step a schedule is evaluated at is the number of optimizer steps
// applied so far, not counting fp16 steps skipped for an overflow: DeepSpeed steps its scheduler
// only when the optimizer step was taken. The host path passes ZeroOptimizer::steps_taken(), the
// fused device step its own count of applied steps (fused_optimizer.h).
//
// The schedule is a few numbers (LrScheduleParams) and one function of them that compiles for
// the host and the GPU: the fused optimizer step evaluates it on the device, so that its memory
// does not grow with the run's length and a captured step needs no per-step input.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define HPC_TRAIN_HOST_DEVICE __host__ __device__
#else
#define HPC_TRAIN_HOST_DEVICE
#endif

namespace hpc_train {

// --lr-schedule and --warmup-type; their names are in config_choices.h.
enum class LrScheduleKind : int32_t { kConstant, kWarmup, kWarmupCosine };
enum class WarmupType : int32_t { kLinear, kLog };

// A schedule as plain numbers, for host and device (the fused GPU step evaluates it itself).
// LrSchedule's constructor validates one.
struct LrScheduleParams {
  LrScheduleKind kind = LrScheduleKind::kConstant;
  WarmupType warmup_type = WarmupType::kLinear;
  double lr = 1e-3;
  int64_t warmup_steps = 0;
  double warmup_start_ratio = 0.0;
  double cosine_final_ratio = 0.0;
  int64_t total_steps = 0;  // for warmup-cosine: the step at which it ends
};

// The learning rate at optimizer step `step` (Note [Schedule step]); before step 0, step 0's.
HPC_TRAIN_HOST_DEVICE inline double lr_at(const LrScheduleParams& p, int64_t step) {
  if (p.kind == LrScheduleKind::kConstant) return p.lr;
  if (step < 0) step = 0;
  if (step < p.warmup_steps) {
    // step < warmup_steps, so warmup_steps >= 2 whenever step >= 1, and log(warmup_steps) > 0;
    // on step 0 both forms give 0 (log(1) = 0), which also covers warmup_steps = 1.
    double gamma = 0.0;
    if (step > 0) {
      gamma = p.warmup_type == WarmupType::kLinear
                  ? static_cast<double>(step) / static_cast<double>(p.warmup_steps)
                  : log(static_cast<double>(step) + 1) / log(static_cast<double>(p.warmup_steps));
    }
    return p.lr * (p.warmup_start_ratio + (1 - p.warmup_start_ratio) * gamma);
  }
  if (p.kind == LrScheduleKind::kWarmup) return p.lr;
  if (step >= p.total_steps) return p.lr * p.cosine_final_ratio;
  const double kPi = 3.14159265358979323846;
  const double progress = static_cast<double>(step - p.warmup_steps) /
                          static_cast<double>(p.total_steps - p.warmup_steps);
  const double cosine = 0.5 * (1 + cos(kPi * progress));
  return p.lr * (p.cosine_final_ratio + (1 - p.cosine_final_ratio) * cosine);
}

class LrSchedule {
 public:
  // Throws ConfigError for a negative warm-up, a ratio outside [0, 1], or a cosine shorter than
  // its warm-up.
  explicit LrSchedule(const LrScheduleParams& params);
  double lr_at(int64_t step) const { return hpc_train::lr_at(params_, step); }
  const LrScheduleParams& params() const { return params_; }

 private:
  LrScheduleParams params_;
};

}  // namespace hpc_train

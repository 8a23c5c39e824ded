// Learning-rate schedules, as functions of the optimizer step (0-based):
//   constant       lr
//   warmup         warm-up from warmup_start_ratio * lr to lr over warmup_steps, then lr
//                  (DeepSpeed's WarmupLR)
//   warmup-cosine  the same warm-up, then a cosine from lr down to cosine_final_ratio * lr at
//                  total_steps (DeepSpeed's WarmupCosineLR)
//   warmup-decay   the same warm-up, then a straight line from lr down to
//                  warmup_start_ratio * lr at total_steps (DeepSpeed's WarmupDecayLR)
//   one-cycle      DeepSpeed's OneCycle: up from cycle_min_ratio * lr to lr over
//                  cycle_first_steps, back down over cycle_second_steps, then (decay_lr_rate > 0)
//                  min_lr / (1 + decay_lr_rate * steps after the cycle / decay_step_size); the
//                  momentum (SGD's, Adam's beta1) runs the other way, from
//                  cycle_max_momentum down to cycle_min_momentum and back (Note [Cycled momentum])
//   multistep      the warm-up, then lr x milestone_gamma ^ (milestones passed), as
//                  torch.optim.lr_scheduler.MultiStepLR stepped once per optimizer step
// The warm-up is linear (step / warmup_steps) or logarithmic (log(step + 1) / log(warmup_steps),
// DeepSpeed's default).
//
// Note [Schedule step]: the step a schedule is evaluated at is the number of optimizer steps
// applied so far, not counting fp16 steps skipped for an overflow: DeepSpeed steps its scheduler
// only when the optimizer step was taken. The host path passes ZeroOptimizer::steps_taken(), the
// fused device step its own count of applied steps (fused_optimizer.h).
//
// Note [DeepSpeed's schedules, step by step]: the formulas of DeepSpeed's schedulers are
// functions of their `last_batch_iteration`; lr_at(step) is DeepSpeed's get_lr() with
// last_batch_iteration = step, for every DeepSpeed schedule here (test_lr_schedule.cpp writes
// DeepSpeed's source out and compares step by step). DeepSpeed's engine steps its scheduler after
// each applied optimizer step, so its k-th step runs at get_lr(k - 1), and its first at what the
// scheduler's constructor left in the optimizer (OneCycle: cycle_min_lr; WarmupLR and
// WarmupDecayLR: the optimizer's own lr): hpc_train runs each value one step earlier. MultiStepLR
// is PyTorch's, whose constructor already counts as step 0: lr_at(k) is what its k-th step runs at.
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
enum class LrScheduleKind : int32_t {
  kConstant,
  kWarmup,
  kWarmupCosine,
  kWarmupDecay,
  kOneCycle,
  kMultiStep
};
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
  int64_t total_steps = 0;  // for warmup-cosine and warmup-decay: the step at which it ends
  // one-cycle (DeepSpeed's OneCycle; lr is its cycle_max_lr)
  double cycle_min_ratio = 0.1;     // cycle_min_lr / lr
  int64_t cycle_first_steps = 0;    // steps up (cycle_first_step_size)
  int64_t cycle_second_steps = 0;   // steps down (cycle_second_step_size)
  double decay_lr_rate = 0.0;       // after the cycle; 0 = stay at the minimum
  int64_t decay_step_size = 0;      // 0 = no decay after the cycle (lr and momentum)
  bool cycle_momentum = false;      // Note [Cycled momentum]
  double cycle_min_momentum = 0.8;
  double cycle_max_momentum = 0.9;
  double decay_momentum_rate = 0.0;
  // multistep
  static constexpr int kMaxMilestones = 16;
  int32_t milestone_count = 0;
  int64_t milestones[kMaxMilestones] = {};  // optimizer steps, ascending
  double milestone_gamma = 0.1;
};

// Note [Cycled momentum]
// DeepSpeed's OneCycle cycles the momentum against the lr: high momentum while the lr is low.
// Here it replaces SGD's momentum, or Adam's beta1 (bias-corrected with the beta1 of the step, as
// torch.optim.Adam does when a scheduler changes its betas). DeepSpeed also sets Adam's beta2 to
// 0.99 while it cycles; the ds_config importer does that, --lr-schedule one-cycle keeps --beta2.
// DeepSpeed does not cycle SGD's momentum (its SGD has no betas); hpc_train does, as PyTorch's
// OneCycleLR does.

// OneCycle's position in its cycle, for DeepSpeed's last_batch_iteration = step: 0 at the cycle's
// minimum lr, 1 at its peak (DeepSpeed's _get_scale_factor).
HPC_TRAIN_HOST_DEVICE inline double one_cycle_scale(const LrScheduleParams& p, int64_t step) {
  const double total = static_cast<double>(p.cycle_first_steps + p.cycle_second_steps);
  const double step_ratio = static_cast<double>(p.cycle_first_steps) / total;
  const double iteration = static_cast<double>(step + 1);
  const double cycle = floor(1 + iteration / total);
  const double x = 1.0 + iteration / total - cycle;
  return x <= step_ratio ? x / step_ratio : (x - 1) / (step_ratio - 1);
}

// Steps after OneCycle's cycle (DeepSpeed's decay_batch_iteration); <= 0 inside the cycle.
HPC_TRAIN_HOST_DEVICE inline double one_cycle_decay_steps(const LrScheduleParams& p, int64_t step) {
  return static_cast<double>(step - (p.cycle_first_steps + p.cycle_second_steps) + 1);
}

// The momentum at optimizer step `step`: the cycled one for a one-cycle schedule that cycles it
// (Note [Cycled momentum]), else `fixed` (the optimizer's own).
HPC_TRAIN_HOST_DEVICE inline double momentum_at(const LrScheduleParams& p, int64_t step,
                                                double fixed) {
  if (p.kind != LrScheduleKind::kOneCycle || !p.cycle_momentum) return fixed;
  if (step < 0) step = 0;
  if (step < p.cycle_first_steps + p.cycle_second_steps) {
    return p.cycle_max_momentum -
           (p.cycle_max_momentum - p.cycle_min_momentum) * one_cycle_scale(p, step);
  }
  if (p.decay_step_size == 0 || p.decay_momentum_rate == 0) return p.cycle_max_momentum;
  return p.cycle_max_momentum *
         (1 + p.decay_momentum_rate * one_cycle_decay_steps(p, step) /
                  static_cast<double>(p.decay_step_size));
}

// The learning rate at optimizer step `step` (Note [Schedule step]); before step 0, step 0's.
HPC_TRAIN_HOST_DEVICE inline double lr_at(const LrScheduleParams& p, int64_t step) {
  if (p.kind == LrScheduleKind::kConstant) return p.lr;
  if (step < 0) step = 0;
  if (p.kind == LrScheduleKind::kOneCycle) {
    const double min_lr = p.lr * p.cycle_min_ratio;
    if (step < p.cycle_first_steps + p.cycle_second_steps)
      return min_lr + (p.lr - min_lr) * one_cycle_scale(p, step);
    if (p.decay_step_size == 0 || p.decay_lr_rate == 0) return min_lr;
    return min_lr / (1 + p.decay_lr_rate * one_cycle_decay_steps(p, step) /
                             static_cast<double>(p.decay_step_size));
  }
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
  switch (p.kind) {
    case LrScheduleKind::kWarmupDecay: {
      // DeepSpeed's WarmupDecayLR: gamma falls linearly from 1 at the warm-up's end to 0 at
      // total_steps and stays there; lr = min_lr + (max_lr - min_lr) * gamma.
      const double span = static_cast<double>(p.total_steps - p.warmup_steps);
      const double gamma = fmax(0.0, static_cast<double>(p.total_steps - step) / fmax(1.0, span));
      return p.lr * (p.warmup_start_ratio + (1 - p.warmup_start_ratio) * gamma);
    }
    case LrScheduleKind::kMultiStep: {
      double lr = p.lr;
      for (int i = 0; i < p.milestone_count; ++i)
        if (step >= p.milestones[i]) lr *= p.milestone_gamma;
      return lr;
    }
    case LrScheduleKind::kWarmupCosine: {
      if (step >= p.total_steps) return p.lr * p.cosine_final_ratio;
      const double kPi = 3.14159265358979323846;
      const double progress = static_cast<double>(step - p.warmup_steps) /
                              static_cast<double>(p.total_steps - p.warmup_steps);
      const double cosine = 0.5 * (1 + cos(kPi * progress));
      return p.lr * (p.cosine_final_ratio + (1 - p.cosine_final_ratio) * cosine);
    }
    default:
      return p.lr;  // warmup: after the warm-up
  }
}

class LrSchedule {
 public:
  // Throws ConfigError for a negative warm-up, a ratio outside [0, 1], a cosine or decay shorter
  // than its warm-up, a one-cycle without steps, or milestones out of order.
  explicit LrSchedule(const LrScheduleParams& params);
  double lr_at(int64_t step) const { return hpc_train::lr_at(params_, step); }
  double momentum_at(int64_t step, double fixed) const {
    return hpc_train::momentum_at(params_, step, fixed);
  }
  const LrScheduleParams& params() const { return params_; }

 private:
  LrScheduleParams params_;
};

}  // namespace hpc_train

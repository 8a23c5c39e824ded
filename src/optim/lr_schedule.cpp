// Learning-rate schedules (lr_schedule.h): DeepSpeed's WarmupLR, WarmupCosineLR, WarmupDecayLR
// and OneCycle and PyTorch's MultiStepLR as pure functions of the optimizer step, so that a
// resumed run recomputes its lr from the step alone.
//
// Two deliberate differences from DeepSpeed's WarmupCosineLR, which the importer of ds_config
// files accepts (deepspeed_config.cpp):
//  - the cosine starts at lr on the first step after the warm-up: progress is
//    (step - warmup_steps) / (total_steps - warmup_steps); DeepSpeed adds 1 to the numerator, so
//    its cosine is one step ahead and reaches its floor one step early;
//  - from total_steps on, the lr stays at cosine_final_ratio * lr; DeepSpeed's cosine turns back
//    up after total_num_steps.
// DeepSpeed also lengthens a warm-up shorter than 2 steps to 2 (it divides by log(warmup)); the
// importer does that when it maps a ds_config, so here warmup_steps means what it says.
#include "hpc_train/optim/lr_schedule.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "hpc_train/error.h"

namespace hpc_train {
namespace {

std::string format_number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

}  // namespace

LrSchedule::LrSchedule(const LrScheduleParams& o) : params_(o) {
  if (o.warmup_steps < 0) {
    throw ConfigError("--warmup-steps " + std::to_string(o.warmup_steps) +
                      ": must be 0 (no warm-up) or more");
  }
  if (!(o.warmup_start_ratio >= 0 && o.warmup_start_ratio <= 1)) {
    throw ConfigError("--warmup-start-ratio " + format_number(o.warmup_start_ratio) +
                      ": must be in [0, 1]");
  }
  if (!(o.cosine_final_ratio >= 0 && o.cosine_final_ratio <= 1)) {
    throw ConfigError("--cosine-final-ratio " + format_number(o.cosine_final_ratio) +
                      ": must be in [0, 1]");
  }
  if (o.kind == LrScheduleKind::kWarmupCosine || o.kind == LrScheduleKind::kWarmupDecay) {
    const char* what = o.kind == LrScheduleKind::kWarmupCosine ? "cosine" : "decay";
    // --schedule-steps 0 means "the whole run": the trainer replaces it by the run's length
    // before it builds the schedule, so 0 here is a caller's mistake.
    if (o.total_steps < 1) {
      throw ConfigError(std::string("warmup-") + what + " schedule of " +
                        std::to_string(o.total_steps) +
                        " steps: give --schedule-steps N >= 1 (0 = the run's length)");
    }
    if (o.total_steps < o.warmup_steps) {
      throw ConfigError("--schedule-steps " + std::to_string(o.total_steps) + ": the " + what +
                        " would end before the warm-up (--warmup-steps " +
                        std::to_string(o.warmup_steps) + ") does; give at least " +
                        std::to_string(o.warmup_steps));
    }
  }
  if (o.kind == LrScheduleKind::kOneCycle) {
    // The trainer resolves 0 (half the run each way) before it builds the schedule.
    if (o.cycle_first_steps < 1 || o.cycle_second_steps < 0) {
      throw ConfigError("one-cycle schedule of " + std::to_string(o.cycle_first_steps) +
                        " steps up and " + std::to_string(o.cycle_second_steps) +
                        " down: give --cycle-first-steps N >= 1 (0 = half the run)");
    }
    if (!(o.cycle_min_ratio >= 0 && o.cycle_min_ratio <= 1)) {
      throw ConfigError("--cycle-min-ratio " + format_number(o.cycle_min_ratio) +
                        ": must be in [0, 1]");
    }
    if (o.decay_step_size < 0 || !(o.decay_lr_rate >= 0) || !(o.decay_momentum_rate >= 0)) {
      throw ConfigError("--cycle-decay-steps " + std::to_string(o.decay_step_size) +
                        ", --cycle-decay-lr-rate " + format_number(o.decay_lr_rate) +
                        " and --cycle-decay-momentum-rate " + format_number(o.decay_momentum_rate) +
                        ": none may be negative");
    }
    if (o.cycle_momentum && !(o.cycle_min_momentum >= 0 && o.cycle_min_momentum <= o.cycle_max_momentum &&
                              o.cycle_max_momentum < 1)) {
      throw ConfigError("--cycle-min-momentum " + format_number(o.cycle_min_momentum) +
                        " and --cycle-max-momentum " + format_number(o.cycle_max_momentum) +
                        ": need 0 <= min <= max < 1");
    }
  }
  if (o.kind == LrScheduleKind::kMultiStep) {
    if (o.milestone_count < 0 || o.milestone_count > LrScheduleParams::kMaxMilestones) {
      throw ConfigError("--lr-milestones: at most " +
                        std::to_string(LrScheduleParams::kMaxMilestones) + " milestones, got " +
                        std::to_string(o.milestone_count));
    }
    for (int i = 0; i < o.milestone_count; ++i) {
      if (o.milestones[i] < 1 || (i > 0 && o.milestones[i] < o.milestones[i - 1])) {
        throw ConfigError("--lr-milestones: optimizer steps >= 1 in ascending order, got " +
                          std::to_string(o.milestones[i]) + " at position " +
                          std::to_string(i + 1));
      }
    }
    if (!(o.milestone_gamma > 0 && o.milestone_gamma <= 1)) {
      throw ConfigError("--lr-gamma " + format_number(o.milestone_gamma) + ": must be in (0, 1]");
    }
  }
}

}  // namespace hpc_train

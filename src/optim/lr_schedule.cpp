// Learning-rate schedules (lr_schedule.h): DeepSpeed's WarmupLR and WarmupCosineLR as pure
// functions of the optimizer step, so that a resumed run recomputes its lr from the step alone.
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
  if (o.kind == LrScheduleKind::kWarmupCosine) {
    // --schedule-steps 0 means "the whole run": the trainer replaces it by the run's length
    // before it builds the schedule, so 0 here is a caller's mistake.
    if (o.total_steps < 1) {
      throw ConfigError("warmup-cosine schedule of " + std::to_string(o.total_steps) +
                        " steps: give --schedule-steps N >= 1 (0 = the run's length)");
    }
    if (o.total_steps < o.warmup_steps) {
      throw ConfigError("--schedule-steps " + std::to_string(o.total_steps) +
                        ": the cosine would end before the warm-up (--warmup-steps " +
                        std::to_string(o.warmup_steps) + ") does; give at least " +
                        std::to_string(o.warmup_steps));
    }
  }
}

}  // namespace hpc_train

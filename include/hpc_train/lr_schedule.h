// Learning-rate schedules, as functions of the optimizer step (0-based):
//   constant       lr
//   warmup         warm-up from warmup_start_ratio * lr to lr over warmup_steps, then lr
//                  (DeepSpeed's WarmupLR)
//   warmup-cosine  the same warm-up, then a cosine from lr down to cosine_final_ratio * lr at
//                  total_steps (DeepSpeed's WarmupCosineLR)
// The warm-up is linear (step / warmup_steps) or logarithmic (log(step + 1) / log(warmup_steps),
// DeepSpeed's default).
#pragma once

#include <cstdint>
#include <string>

namespace hpc_train {

struct LrScheduleOptions {
  std::string kind = "constant";       // constant | warmup | warmup-cosine
  double lr = 1e-3;
  int64_t warmup_steps = 0;
  std::string warmup_type = "linear";  // linear | log
  double warmup_start_ratio = 0.0;
  double cosine_final_ratio = 0.0;
  int64_t total_steps = 0;             // for warmup-cosine: the step at which it ends
};

class LrSchedule {
 public:
  // Throws ConfigError for an unknown kind or warmup type, or a cosine shorter than its warm-up.
  explicit LrSchedule(const LrScheduleOptions& options);
  double lr_at(int64_t step) const;

 private:
  LrScheduleOptions options_;
};

}  // namespace hpc_train

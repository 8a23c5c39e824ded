#include "hpc_train/train/checkpoint_cadence.h"

#include <cstdio>

namespace hpc_train {
namespace {

constexpr double kMsPerMinute = 60e3;

// "every 30 min", "every 0.5 min": the minutes as given.
std::string every_minutes_text(double minutes) {
  char text[64];
  std::snprintf(text, sizeof text, "every %g min", minutes);
  return text;
}

}  // namespace

CheckpointCadence::CheckpointCadence(int64_t every_steps, double every_minutes)
    : every_steps_(every_steps), every_minutes_(every_minutes),
      steps_reason_("every " + std::to_string(every_steps) + " steps"),
      minutes_reason_(every_minutes_text(every_minutes)) {}

bool CheckpointCadence::minutes_elapsed() const {
  return every_minutes_ > 0 && since_checkpoint_.elapsed_ms() >= every_minutes_ * kMsPerMinute;
}

bool CheckpointCadence::take_minutes_elapsed() {
  if (!minutes_elapsed()) return false;
  since_checkpoint_.restart();
  return true;
}

const char* CheckpointCadence::due(int64_t global_step, bool minutes_elapsed_on_rank_0) const {
  if (every_steps_ > 0 && global_step % every_steps_ == 0) return steps_reason_.c_str();
  if (minutes_elapsed_on_rank_0) return minutes_reason_.c_str();
  return nullptr;
}

}  // namespace hpc_train

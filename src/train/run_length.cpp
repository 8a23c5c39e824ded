#include "hpc_train/train/run_length.h"

#include <algorithm>

namespace hpc_train {

RunLength::RunLength(int first_epoch, int epochs, int64_t first_epoch_micro_steps,
                     int64_t micro_steps_per_epoch, int grad_accum, int64_t first_global_step,
                     int64_t max_steps)
    : first_epoch_(first_epoch), epochs_(epochs),
      first_epoch_micro_steps_(std::max<int64_t>(0, first_epoch_micro_steps)),
      micro_steps_per_epoch_(micro_steps_per_epoch), grad_accum_(std::max(1, grad_accum)),
      first_global_step_(first_global_step), max_steps_(max_steps),
      session_micro_steps_(micro_steps_through(epochs - 1)) {}

int64_t RunLength::micro_steps_through(int epoch) const {
  if (epoch < first_epoch_) return 0;
  return first_epoch_micro_steps_ + (epoch - first_epoch_) * micro_steps_per_epoch_;
}

int64_t RunLength::micro_steps_in_epoch(int epoch) const {
  return micro_steps_through(epoch) - micro_steps_through(epoch - 1);
}

int64_t RunLength::updates_after(int64_t micro_steps) const {
  // Whole windows, and at the session's end the final partial one (Note [Run length]).
  if (micro_steps >= session_micro_steps_) return (session_micro_steps_ + grad_accum_ - 1) / grad_accum_;
  return micro_steps / grad_accum_;
}

int64_t RunLength::last_global_step() const {
  const int64_t end = first_global_step_ + updates_after(session_micro_steps_);
  return max_steps_ > 0 ? std::min(end, std::max(first_global_step_, max_steps_)) : end;
}

int RunLength::window_micro_steps(int64_t session_micro_step) const {
  const int64_t window_start = session_micro_step / grad_accum_ * grad_accum_;
  return static_cast<int>(std::min<int64_t>(grad_accum_, session_micro_steps_ - window_start));
}

bool RunLength::ends_update(int64_t session_micro_step) const {
  return (session_micro_step + 1) % grad_accum_ == 0 ||
         session_micro_step + 1 == session_micro_steps_;
}

int64_t RunLength::updates_done_in_epoch(int epoch, int64_t micro_steps_done_in_first_epoch) const {
  if (epoch != first_epoch_) return 0;
  // Exact for the checkpoint's own layout: the checkpoint fell on an update, and of the micro-
  // steps of this epoch before it, ceil(done / G) updates ended in this epoch (the first may
  // have started in the epoch before).
  return (micro_steps_done_in_first_epoch + grad_accum_ - 1) / grad_accum_;
}

int64_t RunLength::updates_in_epoch(int epoch, int64_t micro_steps_done_in_first_epoch) const {
  return updates_done_in_epoch(epoch, micro_steps_done_in_first_epoch) +
         updates_after(micro_steps_through(epoch)) - updates_after(micro_steps_through(epoch - 1));
}

}  // namespace hpc_train

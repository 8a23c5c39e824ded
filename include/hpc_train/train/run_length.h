// How long the run is, counted as DeepSpeed counts it: in micro-steps, which carry over epoch
// boundaries; which micro-step ends an optimizer step (an update); how many updates each epoch
// holds. The trainer asks; the LR schedule plans exactly total_updates(). Pure arithmetic: no
// LibTorch, no MPI.
#pragma once

#include <cstdint>

namespace hpc_train {

// Note [Run length]
// With --grad-accum G, an update takes G micro-steps, and micro-steps carry over epoch
// boundaries (as DeepSpeed's engine counts them): an epoch of M micro-steps holds M / G updates
// give or take one, and an update may start in one epoch and end in the next. So the run is
// counted in micro-steps: the session's R micro-steps make ceil(R / G) updates, the last one a
// final partial window of R mod G micro-steps when G does not divide R. That window is applied,
// its gradient averaged over the micro-steps it has (Note [Gradient averaging] in training_step.cpp):
// no micro-step is computed and then dropped, and the LR schedule plans exactly the updates the
// run takes (earlier, floor(M / G) x epochs planned fewer, and the run's last updates trained at
// lr 0). An update belongs to the epoch its last micro-step is in: that epoch's log counts it,
// and an epoch that ends inside an update has its epoch-end checkpoint at that update (the first
// update at or after the epoch's end; a checkpoint is only ever written between updates, so a
// resumed run starts on a whole window). --max-steps cuts the plan.
class RunLength {
 public:
  // This session's training: epochs `first_epoch` .. `epochs - 1`, the first of which has
  // `first_epoch_micro_steps` micro-steps left (all of them, or what a resumed checkpoint left),
  // the others `micro_steps_per_epoch` each; the session starts after update
  // `first_global_step` (0, or a resumed checkpoint's); --max-steps `max_steps` (0 = none).
  RunLength(int first_epoch, int epochs, int64_t first_epoch_micro_steps,
            int64_t micro_steps_per_epoch, int grad_accum, int64_t first_global_step,
            int64_t max_steps);

  // The global step the run ends at: every update counted from the run's start (the LR
  // schedule's total steps).
  int64_t last_global_step() const;

  // The micro-steps this session trains of `epoch`.
  int64_t micro_steps_in_epoch(int epoch) const;

  // Micro-steps in the update that the session's `session_micro_step`-th (0-based) micro-step
  // belongs to: --grad-accum, or fewer for the final partial window.
  int window_micro_steps(int64_t session_micro_step) const;

  // Whether the session's `session_micro_step`-th micro-step is the last of its update.
  bool ends_update(int64_t session_micro_step) const;

  // The updates whose last micro-step falls in `epoch`: all of them for an epoch this session
  // trains whole; for its first epoch, a resumed one, what is left of it plus an estimate of
  // those before the checkpoint from `micro_steps_done_in_first_epoch` (exact when the
  // checkpoint's layout is this run's). Not cut by --max-steps.
  int64_t updates_in_epoch(int epoch, int64_t micro_steps_done_in_first_epoch) const;

  // What the log announces of a whole epoch: it holds fewest_updates_per_epoch() updates or one
  // more, micro-steps carrying over its boundaries (equal when --grad-accum divides them).
  int64_t fewest_updates_per_epoch() const { return micro_steps_per_epoch_ / grad_accum_; }
  int64_t most_updates_per_epoch() const {
    return (micro_steps_per_epoch_ + grad_accum_ - 1) / grad_accum_;
  }

  // The updates before `epoch`'s first that end in it, for the resumed first epoch (the same
  // estimate); 0 for every other epoch.
  int64_t updates_done_in_epoch(int epoch, int64_t micro_steps_done_in_first_epoch) const;

 private:
  // Updates complete after the session's first `micro_steps` micro-steps.
  int64_t updates_after(int64_t micro_steps) const;
  // Micro-steps of the session up to the end of `epoch`.
  int64_t micro_steps_through(int epoch) const;

  int first_epoch_;
  int epochs_;
  int64_t first_epoch_micro_steps_;
  int64_t micro_steps_per_epoch_;
  int grad_accum_;
  int64_t first_global_step_;
  int64_t max_steps_;
  int64_t session_micro_steps_;  // R of Note [Run length]
};

}  // namespace hpc_train

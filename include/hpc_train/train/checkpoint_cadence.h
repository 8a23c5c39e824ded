// When the run writes a checkpoint between epoch ends: every --checkpoint-every steps, and
// every --checkpoint-every-minutes of wall time (Note [Checkpoint clock]); a checkpoint is
// written when either rule is due. The trainer asks after every optimizer step and has
// RunCheckpoints (training_state.h) write; this unit only decides. No LibTorch, no MPI.
#pragma once

#include <cstdint>
#include <string>

#include "hpc_train/monitor/metrics.h"

namespace hpc_train {

// Note [Checkpoint clock]
// An elastic restart goes back to the newest checkpoint, so what a lost node costs is the
// time since that checkpoint: --checkpoint-every-minutes bounds it in time, whatever a step
// takes. A checkpoint is collective, so every rank must decide alike after the same step, and
// the ranks' clocks do not agree (each step ends on each rank at its own moment). So rank 0's
// clock decides, and its answer travels in the collective that the trainer already runs after
// every step to agree on a stop signal: one all-reduce (maximum) of [stop signal, clock's
// answer], in which the other ranks answer 0, posted after a step and acted on after the next
// (Note [Stop agreement] in step_agreement.h). No collective is added to a step. The clock
// starts with the run's steps, again when it asks for a checkpoint, and again at every
// checkpoint written, whatever wrote it (the step rule, an epoch's end): the time at risk is
// the time since the newest checkpoint.
class CheckpointCadence {
 public:
  // `every_steps` (--checkpoint-every) and `every_minutes` (--checkpoint-every-minutes), 0 =
  // that rule is off. The clock starts now.
  CheckpointCadence(int64_t every_steps, double every_minutes);

  // Whether --checkpoint-every-minutes have passed on this rank's clock since it started or
  // since the last checkpoint written; false when the rule is off. Only rank 0's answer is
  // used (Note [Checkpoint clock]).
  bool minutes_elapsed() const;

  // minutes_elapsed(), and a true answer starts the clock again. The trainer asks this after each
  // step: its answer travels to the other ranks and the checkpoint it asks for is written a step
  // later (Note [Stop agreement] in step_agreement.h); asked again meanwhile, the clock would
  // ask for a second one.
  bool take_minutes_elapsed();

  // Why a checkpoint is due after optimizer step `global_step`, given rank 0's answer of
  // minutes_elapsed() as every rank agreed on it: the rule that fired ("every 50 steps",
  // "every 30 min"; the step rule when both do), or nullptr when none does.
  const char* due(int64_t global_step, bool minutes_elapsed_on_rank_0) const;

  // A checkpoint was written, for any reason: the clock starts again.
  void checkpoint_written() { since_checkpoint_.restart(); }

 private:
  int64_t every_steps_;
  double every_minutes_;
  std::string steps_reason_;    // "every 50 steps"
  std::string minutes_reason_;  // "every 30 min"
  Stopwatch since_checkpoint_;
};

}  // namespace hpc_train

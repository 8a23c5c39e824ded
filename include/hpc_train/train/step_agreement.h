// What the ranks decide alike after an optimizer step, without a blocking collective per step:
// a stop signal received by any rank, and rank 0's checkpoint clock (Note [Stop agreement]).
#pragma once

#include <vector>

#include "hpc_train/comm/comm.h"

namespace hpc_train {

// Note [Stop agreement]
// After a step the ranks must agree whether to stop (SIGUSR1/SIGTERM reach the ranks one by one,
// or only some of them: stop_signal.h) and whether rank 0's clock asks for a checkpoint (Note
// [Checkpoint clock] in checkpoint_cadence.h): one small all-reduce (maximum) of [signal, clock].
// Waiting for it after every step would tie each step's end to every other rank's and to a
// network round trip. So the answers after step N are posted in a non-blocking all-reduce and
// its result is waited for after step N+1: by then every rank has posted it (each posted it
// before step N+1's gradient collectives, which completed), so the wait finds it done or nearly.
// Every rank acts on step N's answers after step N+1, alike: a signal stops the run one step
// later than it would with a blocking agreement, a clock's checkpoint falls one step later. With
// one rank there is nothing to agree on: it acts after step N. The posted all-reduce is not
// watched (it stays unfinished across a step by design); a rank that is gone stalls the next
// step's collectives, which are. The all-reduce goes over MPI whatever the tensor backend, called
// from the trainer's thread only, as the Communicator's other host collectives are.
class StepAgreement {
 public:
  // What the ranks agreed, as of one step.
  struct Agreed {
    int stop_signal = 0;  // the largest signal number any rank had received; 0 = go on
    bool checkpoint_minutes_elapsed = false;  // rank 0's clock had run out
  };

  explicit StepAgreement(Communicator& comm);
  ~StepAgreement();
  StepAgreement(const StepAgreement&) = delete;
  StepAgreement& operator=(const StepAgreement&) = delete;

  // After every optimizer step, on every rank: posts this rank's answers (`stop_signal` received,
  // 0 = none; `checkpoint_minutes_elapsed`, only rank 0's counts) and returns what the ranks
  // answered after the step before (nothing to act on after the first step). With one rank,
  // returns this step's answers.
  Agreed after_step(int stop_signal, bool checkpoint_minutes_elapsed);

  // Waits for the all-reduce still posted, if any, so that nothing is left in flight when the
  // run ends (every rank calls it, having posted alike).
  void finish();

 private:
  Communicator& comm_;
  std::vector<double> in_flight_values_;  // [signal, clock] while posted, then the maxima
  Work in_flight_;
  bool posted_ = false;
};

}  // namespace hpc_train

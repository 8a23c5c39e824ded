#include "hpc_train/train/step_agreement.h"

#include <exception>
#include <utility>

namespace hpc_train {

StepAgreement::StepAgreement(Communicator& comm) : comm_(comm) {}

StepAgreement::~StepAgreement() {
  // An error unwinding the run drops the posted all-reduce unwaited (Note [Ending the job]); a
  // run that ended normally has waited for it in finish().
  if (posted_ && std::uncaught_exceptions() == 0) {
    try {
      in_flight_.wait();
    } catch (const std::exception&) {
    }
  }
}

StepAgreement::Agreed StepAgreement::after_step(int stop_signal, bool checkpoint_minutes_elapsed) {
  const bool clock = comm_.rank() == 0 && checkpoint_minutes_elapsed;
  if (comm_.size() == 1) return {stop_signal, clock};
  Agreed agreed;
  if (posted_) {
    in_flight_.wait();
    agreed.stop_signal = static_cast<int>(in_flight_values_[0]);
    agreed.checkpoint_minutes_elapsed = in_flight_values_[1] > 0;
  }
  in_flight_values_ = {static_cast<double>(stop_signal), clock ? 1.0 : 0.0};
  in_flight_ = comm_.start_all_reduce_doubles(in_flight_values_, ReduceOp::kMax, "after step");
  posted_ = true;
  return agreed;
}

void StepAgreement::finish() {
  if (!posted_) return;
  posted_ = false;
  in_flight_.wait();
}

}  // namespace hpc_train

// The device path of ZeroOptimizer in a CPU build (zero_optimizer.h): parameters are never on a
// GPU, so none of these is reached; each throws, naming the method. The GPU build's are in
// zero_optimizer_cuda.cpp.
#include "hpc_train/optim/zero_optimizer.h"

namespace hpc_train {

void ZeroOptimizer::create_device_buffers() { no_gpu("create_device_buffers"); }
void ZeroOptimizer::prepare_device_layout() { no_gpu("prepare_device_layout"); }
void ZeroOptimizer::enqueue_device_step(const HostStepInputs*) { no_gpu("step"); }
StepReport ZeroOptimizer::read_device_report() const { no_gpu("read_device_report"); }
void ZeroOptimizer::load_device_state(int64_t, int64_t, const LossScalerState&) {
  no_gpu("load_device_state");
}

}  // namespace hpc_train

#include "hpc_train/train/graphed_step.h"

#include <ATen/ATen.h>

#include <string>

#include "hpc_train/comm/comm.h"
#include "hpc_train/error.h"
#include "hpc_train/monitor/run_report.h"

namespace hpc_train {

bool GraphedStep::run(const DeviceBatch& batch, int64_t step,
                      const std::function<void(const DeviceBatch&)>& enqueue_step,
                      const std::function<void()>& discard_step, Communicator& comm,
                      RunReporter& reporter) {
  if (!graph_.captured()) {
    static_batch_ = {at::empty_like(batch.input), at::empty_like(batch.labels)};
    std::string why;
    comm.set_capturing(true);
    const bool captured =
        graph_.capture([&] { enqueue_step(static_batch_); }, discard_step, &why);
    comm.set_capturing(false);
    if (!captured) {
      enabled_ = false;
      if (required_) throw Error("--cuda-graph on: capturing the step failed: " + why);
      reporter.say("CUDA graph capture failed (%s); the steps run eagerly\n", why.c_str());
      return false;
    }
    captured_now_ = true;
    reporter.say("Training step captured as a CUDA graph\n");
  }
  static_batch_.input.copy_(batch.input);
  static_batch_.labels.copy_(batch.labels);
  replay(step, comm);
  return true;
}

void GraphedStep::replay(int64_t step, Communicator& comm) {
  graph_.replay(comm, "step " + std::to_string(step + 1));
}

}  // namespace hpc_train

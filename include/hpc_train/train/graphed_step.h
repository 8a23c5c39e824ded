// The training step replayed from a CUDA graph (--cuda-graph): after a few eager steps, one
// whole step (forward, backward, reduction, optimizer) is captured on static input buffers
// (StepGraph, step_graph.h), and from then on every full, synchronised step has its batch
// written into those buffers and replays the graph.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>

#include "hpc_train/data/device_input.h"
#include "hpc_train/train/step_graph.h"

namespace hpc_train {

class Communicator;
class RunReporter;

// Eager steps before a step is captured: the first one's gradients decide the bucket layout,
// and LibTorch initialises its libraries' handles and workspaces, and cuDNN autotunes (Note
// [cuDNN autotuning] in run_options.h), in the first few (as torch.cuda.graphs asks for warm-up
// iterations).
inline constexpr int64_t kEagerStepsBeforeCapture = 3;

class GraphedStep {
 public:
  // `enabled`: capture_steps' answer (run_options.h); `required`: --cuda-graph on, under which
  // a failed capture throws instead of falling back to eager steps.
  GraphedStep(bool enabled, bool required) : enabled_(enabled), required_(required) {}

  // Whether the next step runs from the graph: it synchronises gradients, the bucket layout is
  // final, its micro-batch is full (the static buffers' shape), and `eager_steps_run` steps of
  // this run have warmed up.
  bool wanted(bool sync, bool layout_final, bool full_batch, int64_t eager_steps_run) const {
    return enabled_ && sync && layout_final && full_batch &&
           eager_steps_run >= kEagerStepsBeforeCapture;
  }

  // Runs step `step` (the global step, from 0) on `batch`, in the model's layout, from the
  // graph, copying it into the static buffers; the first call captures `enqueue_step` first.
  // Returns false when that capture failed (said through `reporter`), after `discard_step` has
  // put back what the partly queued step changed (Note [Failed capture] in step_graph.h): the
  // caller runs the step eagerly, and no capture is tried again. Throws Error instead when the
  // graph is required.
  bool run(const DeviceBatch& batch, int64_t step,
           const std::function<void(const DeviceBatch&)>& enqueue_step,
           const std::function<void()>& discard_step, Communicator& comm, RunReporter& reporter);

  // Once the graph is captured, a step's batch goes straight into static_batch()
  // (DeviceInput::take_into, Note [One input kernel] in device_input.cpp) and replay() runs it.
  bool captured() const { return graph_.captured(); }
  DeviceBatch& static_batch() { return static_batch_; }
  // Replays the captured step `step` (the global step, from 0) on what static_batch() holds.
  void replay(int64_t step, Communicator& comm);

  // True once, after the step that captured the graph (host timers of that step mean nothing:
  // the throughput clock starts again there).
  bool take_captured_now() { return std::exchange(captured_now_, false); }

 private:
  bool enabled_;
  bool required_;
  bool captured_now_ = false;
  StepGraph graph_;
  DeviceBatch static_batch_;  // the captured step's input buffers
};

}  // namespace hpc_train

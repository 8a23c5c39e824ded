// A training step captured once as a CUDA graph and replayed: the step's hundreds of kernel
// launches (forward, backward, NCCL collectives, the fused optimizer) become one launch, so the
// host's per-kernel overhead — most of a small model's step time — is paid once.
//
// What the captured step may do: only work queued on the current stream (and on streams that
// join it through events, as the NCCL backend's do); no host synchronisation (.item(), event
// queries, blocking copies); reads and writes only of tensors that outlive the graph (the flat
// parameter and gradient buffers, the optimizer state, static input buffers). Memory the step
// allocates comes from the graph's private pool and is the same on every replay.
// Built only in the GPU build; elsewhere cuda_graphs_available() is false.
//
// The whole training runs on the stream of a TrainingStreamScope, made before the gradient
// accumulators are (Note [Training stream] in trainer.cpp); otherwise autograd ties the default
// stream into the backward and the capture fails.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace hpc_train {

class Communicator;

bool cuda_graphs_available();

// For its lifetime, a stream of its own is the current CUDA stream of the calling thread (GPU
// build; elsewhere it does nothing). Training runs in one: the eager steps before a capture and
// the capture itself must use the same non-default stream, or autograd would tie the default
// stream into the capture (and CUDA refuses that). Work queued before is ordered before, and
// work after after.
class TrainingStreamScope {
 public:
  explicit TrainingStreamScope(bool cuda);
  ~TrainingStreamScope();
  TrainingStreamScope(const TrainingStreamScope&) = delete;
  TrainingStreamScope& operator=(const TrainingStreamScope&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class StepGraph {
 public:
  StepGraph();
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Captures what `enqueue_step` queues on the current stream, which must not be the default
  // one (see TrainingStreamScope). Nothing captured runs now. Returns false with the reason in *why when the
  // capture failed (an operation that cannot be captured); the streams are usable afterwards.
  bool capture(const std::function<void()>& enqueue_step, std::string* why);
  bool captured() const;
  // Launches the captured step on the current stream, through `comm` (whose collectives it
  // holds: Communicator::launch_captured), and registers the replay with comm's watchdog as one
  // operation, "graph replay" of `label` ("step 12"), finished when the stream has run it
  // (Note [Communication watchdog] in comm.h). Throws Error once the watchdog has failed.
  void replay(Communicator& comm, const std::string& label);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hpc_train

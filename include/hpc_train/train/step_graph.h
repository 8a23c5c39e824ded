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
// accumulators are (Note [Training stream] in trainer_impl.h); otherwise autograd ties the default
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

// Note [Failed capture]
// A capture that fails inside the step (an operation that cannot be captured, an error thrown by
// the step) stops part-way: nothing captured has run on the GPU, but the host has gone on as if
// the step had been queued, and the eager step that replaces it (GraphedStep::run) must find
// everything as an eager run would. StepGraph::capture puts back
//  - the capture: ended through LibTorch (CUDAGraph::capture_end) while CUDA still holds it
//    valid, so that LibTorch's bookkeeping ends with it (the caching allocator stops sending
//    allocations to the capture's private pool, which goes with the graph; the CUDA generator
//    leaves its capture mode); an invalidated one through CUDA; CUDA's last error is cleared;
//  - the step's state, through the caller's `discard_step`: the reducer forgets the backward
//    (its in-backward state and its buckets' collectives) and the gradients are zeroed, which
//    drops the `.grad` tensors that autograd left from the capture (Reducer::discard_backward):
//    never computed, an eager backward would otherwise add its gradients into them;
//  - the default generators, CPU and CUDA, as they were before the capture (the CUDA one as a
//    copy of its state then: LibTorch's generator is left in capture mode by a capture that did
//    not end through it, and then refuses every later draw; with LibTorch 2.11, vgg11_bn's first
//    eager dropout after such a capture ended the run with "Offset increment outside graph
//    capture encountered unexpectedly"), so that the eager step's dropout draws what an eager
//    run's draws (Note [Random state in checkpoints] in training_state.h).
// The test-only HPC_TRAIN_TEST_FAULT=capture@RANK (Note [Test hooks]) fails a capture half-way
// through the backward; tests/test_capture_failure.sh checks that the run then ends bitwise equal
// to an eager one.

class StepGraph {
 public:
  StepGraph();
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Captures what `enqueue_step` queues on the current stream, which must not be the default
  // one (see TrainingStreamScope). Nothing captured runs now. Returns false with the reason in
  // *why when the capture failed (an operation that cannot be captured, or an error thrown by
  // the step), having put back what the capture changed (Note [Failed capture]), with
  // `discard_step` for what the step itself changed on the host: the streams, the random
  // generators and the step's state are then as before the capture.
  bool capture(const std::function<void()>& enqueue_step,
               const std::function<void()>& discard_step, std::string* why);
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

// The reducer: averages gradients across ranks bucket by bucket, overlapping communication with
// backward (Note [Bucket layout] in buckets.h says where buckets live).
//
// An autograd post-hook on each parameter's gradient accumulator marks the parameter ready once
// autograd has left its gradient in `.grad`. When every parameter of a bucket is ready, the
// bucket's gradients are collected into the flat buffer (Note [Flat parameter storage]) and its
// collective starts at once, while backward goes on: an all-reduce in place (ZeRO stages 0 and
// 1), or a reduce-scatter whose slice for this rank lands in partition_grads() (stage 2).
// Buckets start in bucket order on every rank (a ready bucket waits for its predecessors),
// because MPI and NCCL match collectives by issue order. The step then waits only for what is
// still in flight (finish_backward).
//
// The reducer owns the bucket layout, as PyTorch's Reducer does: after the first synchronised
// backward it rebuilds the buckets in the order in which the gradients really became ready (rank
// 0's order, so every rank rebuilds alike), moving the flat buffers into the new layout. What
// others keep per element of this rank's partition (the ZeRO optimizer's state) sees partitions
// only (partition(), Partition in buckets.h) and is told around a re-layout (LayoutObserver).
//
// The reducer owns the gradients' dtypes (Note [Gradient precision] in flat_parameters.h): it
// applies ReducerOptions::precision to the flat storage when it is made, sizes buckets by the
// bytes their collectives move, and with fp32 accumulation also collects the buckets of the
// micro-steps inside an accumulation window (as they complete; no collective starts).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hpc_train/comm/buckets.h"
#include "hpc_train/comm/comm.h"
#include "hpc_train/comm/flat_parameters.h"
#include "hpc_train/monitor/metrics.h"

namespace hpc_train {

struct ReducerOptions {
  int64_t first_bucket_bytes = static_cast<int64_t>(kDefaultFirstBucketMiB * (1 << 20));
  int64_t bucket_bytes = static_cast<int64_t>(kDefaultBucketMiB * (1 << 20));
  bool overlap = true;         // start collectives from the hooks; false: all after backward
  bool reduce_scatter = false; // ZeRO-2
  // Note [Gradient precision]: --grad-accum-dtype fp32 (with --grad-accum > 1) and --comm-dtype
  // fp32; no-ops in an fp32 model.
  GradientPrecision precision;
};

// What happened to the buckets in the last synchronised backward, in order, with times in
// milliseconds since begin_backward (for metrics and the overlap test).
struct ReducerEvent {
  enum class Kind { kCollectiveStarted, kBackwardEnded, kAllDone };
  Kind kind;
  int bucket = -1;
  double time_ms = 0.0;

  std::string describe() const;  // "bucket 2 started", "backward ended", "all done"
};

// State laid out like the flat buffers or this rank's partition of them, kept outside the
// reducer (the ZeRO optimizer's master weights and moments): told around a re-layout, so that it
// can carry that state over (e.g. through the logical layout, flat_parameters.h).
class LayoutObserver {
 public:
  virtual ~LayoutObserver() = default;
  // Before the buffers move: partition() is still the old one. Collective.
  virtual void before_relayout() = 0;
  // After they moved: partition() is the new one. Collective.
  virtual void after_relayout() = 0;
};

class Reducer {
 public:
  // Registers the hooks and sets `flat`'s gradient precision (which zeroes its gradients).
  // `flat` and `comm` must outlive the reducer.
  Reducer(FlatParameters& flat, Communicator& comm, ReducerOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // The initial layout for `flat`'s parameters: buckets in reverse parameter order.
  static BucketLayout initial_layout(const std::vector<at::Tensor>& parameters,
                                     const ReducerOptions& options, int world_size);

  // Call before each backward. sync = false on micro-steps inside a gradient-accumulation
  // window: no collective starts, and gradients accumulate in the parameters' `.grad` (or, with
  // fp32 accumulation, each bucket is collected into the fp32 sum as it completes).
  void begin_backward(bool sync);
  // After backward of a synchronised micro-step: starts what has not started, waits for all.
  // Returns the time spent waiting (exposed communication), in milliseconds. After a micro-step
  // inside the window: collects what fp32 accumulation has not collected yet; returns 0.
  double finish_backward();
  // Forgets a backward that will not finish (Note [Failed capture] in step_graph.h: a CUDA graph
  // capture that threw inside it): the collectives it started are dropped (reducer.cpp says how
  // their Works end), its buckets' bookkeeping is cleared, and the gradients are zeroed, with
  // every `.grad` it left dropped (FlatParameters::zero_grads), as before a backward. The next
  // backward then begins as if this one had never run. Collective where collectives started.
  void discard_backward();

  // ZeRO-2: this rank's slice of every bucket, reduced (the layout's partition order). With one
  // rank, the flat gradient buffer itself.
  at::Tensor& partition_grads() { return partition_grads_; }

  // This rank's partition of the current layout (its slice of every bucket).
  const Partition& partition() const { return partition_; }
  // Every rank's slice of every bucket of `flat_layout` (a tensor laid out like the flat
  // buffers) to every rank, in place: after each rank has written its own slices (the ZeRO
  // optimizer's updated parameters). Nothing to do with one rank. Collective.
  void all_gather_slices(at::Tensor& flat_layout);

  // After the first synchronised backward: rebuilds the buckets in rank 0's observed ready
  // order, moving the flat buffers into that layout, with the observer (if any) told before and
  // after. Returns whether the layout changed (nothing happens when it did not). Collective.
  bool rebuild_buckets();
  // The one observer of re-layouts; it must outlive the reducer or stop observing first.
  void observe_layout(LayoutObserver* observer) { layout_observer_ = observer; }
  void stop_observing_layout(const LayoutObserver* observer) {
    if (layout_observer_ == observer) layout_observer_ = nullptr;
  }

  const std::vector<ReducerEvent>& events() const { return events_; }
  // Bytes handed to collectives in the last synchronised backward (padded bucket sizes).
  int64_t bytes_last_backward() const { return bytes_last_backward_; }
  // From the first collective's start to the last one's observed completion, milliseconds.
  double comm_span_ms() const { return comm_span_ms_; }
  size_t num_buckets() const { return flat_.layout().buckets.size(); }
  // Bytes of gradient storage this rank holds: the flat buffer, plus the partition in stage 2
  // (with more than one rank), plus a separate fp32 accumulation buffer (Note [Gradient
  // precision]).
  int64_t gradient_bytes() const;

 private:
  class ReadyHook;
  // A layout whose buckets follow rank 0's observed ready order. Collective.
  BucketLayout rebuilt_layout();
  // Reads `flat`'s layout: bucket membership, the partition, the stage-2 partition buffer.
  void reset_buckets();
  void mark_ready(int parameter);
  void start_ready_buckets();
  void start_bucket(size_t bucket);
  double now_ms() const;
  bool partition_is_separate() const;  // ZeRO-2 with several ranks
  // The bucket assignment's size of one gradient element of `parameter`: what its collective
  // moves (fp32 with reduce_fp32).
  static int gradient_element_bytes(const at::Tensor& parameter, const ReducerOptions& options);

  FlatParameters& flat_;
  Communicator& comm_;
  ReducerOptions options_;
  std::vector<std::shared_ptr<void>> accumulators_;  // keeps the hooked grad accumulators alive
  std::vector<uintptr_t> hook_keys_;                 // to unhook them
  std::vector<int> bucket_of_;                       // per parameter
  std::vector<int> pending_;                         // per bucket: parameters not yet ready
  std::vector<bool> ready_;                          // per parameter, this backward
  std::vector<int> ready_order_;                     // this backward
  size_t next_bucket_ = 0;                           // the next bucket to start
  std::vector<Work> in_flight_;
  bool sync_ = false;
  bool collecting_ = false;  // this backward's hooks count ready parameters (sync, or fp32 sums)
  bool in_backward_ = false;
  at::Tensor partition_grads_;
  Partition partition_;
  LayoutObserver* layout_observer_ = nullptr;
  std::vector<ReducerEvent> events_;
  int64_t bytes_last_backward_ = 0;
  double comm_span_ms_ = 0.0;
  Stopwatch backward_clock_;  // started by begin_backward
  double first_start_ms_ = -1.0;
  // Test-only (HPC_TRAIN_TEST_FAULT=capture@RANK, Note [Test hooks]): a backward captured into
  // a CUDA graph (Communicator::capturing) throws once its first bucket has started, with the
  // backward half done and, where there are peers, that bucket's collective in flight: what a
  // capture that fails inside the step leaves behind (Note [Failed capture] in step_graph.h).
  bool test_fail_capture_ = false;
};

}  // namespace hpc_train

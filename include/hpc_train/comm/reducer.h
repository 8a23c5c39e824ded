// The reducer: averages gradients across ranks bucket by bucket, overlapping communication with
// backward (Note [Bucket layout] in buckets.h says where buckets live).
//
// An autograd post-hook on each parameter's gradient accumulator marks the parameter ready once
// autograd has left its gradient in `.grad`. When every parameter of a bucket is ready, the
// bucket's gradients are collected into the flat buffer (Note [Flat parameter storage]), or a
// staging buffer at ZeRO-2, and its collective starts at once, while backward goes on
// (GradientReduction says which collective and where its result lands).
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

// Note [Partitioned gradients]
// ZeRO-2 partitions the gradients, as DeepSpeed's stage 2 does: with several ranks, each rank
// keeps only its partition of the reduced gradients (partition_grads(): its slice of every
// bucket, 1/N of the flat layout), and no full-size gradient buffer exists (FlatParameters keeps
// none). Autograd's gradients leave `.grad` bucket by bucket as their bucket becomes ready, into
// a ring of kStagingBuckets staging buffers, and each bucket is reduce-scattered from there into
// its slice of the partition while backward goes on. A staging buffer is reused once the
// collective that read it has finished: the collective kStagingBuckets later waits for it. A
// staging buffer holds a bucket of the bucket cap (--bucket-mb), or a bucket of several
// parameters, which passes the cap by its alignment gaps and padding at most. A parameter larger
// than the cap has a bucket of its own, and goes through in chunks: a piece of every rank's
// slice at a time. So a rank's gradient memory is full/N plus two buckets (gradient_bytes()),
// besides the `.grad`s autograd holds until their bucket is complete; the bucket cap bounds
// what the ring costs (Note [Bucket size at ZeRO-2] in run_options.h).
// Inside an accumulation window the reduce-scatter runs at every micro-step (as DeepSpeed's
// stage 2 does: nothing full-size is kept across micro-steps): the window's first micro-step
// writes the partition, the later ones add into it. Those reduce-scatter in place into this rank's
// own slice of the staging buffer and add that slice into the partition once the collective has
// finished (before the buffer is reused, or in finish_backward); so does the first micro-step
// where the partition is fp32 and the staging buffer is not (--grad-accum-dtype fp32 without
// --comm-dtype fp32: the window then adds up in fp32, in the partition). Each micro-step's
// reduction rounds to the communication dtype before it is added, where ZeRO-0/1 add the
// micro-steps up before one reduction: the sums agree to rounding, not bit for bit.
//
// Where the reduced gradients land, by ZeRO stage (reduction_for_zero_stage).
enum class GradientReduction {
  kAllReduce,    // stage 0: an all-reduce in place: every rank holds every reduced gradient
  // Stage 1: a reduce-scatter in place: this rank's own slices of the flat gradient buffer hold
  // its reduced partition (the rest is left unreduced). Half an all-reduce's traffic: with the
  // parameters' all-gather a step moves what one all-reduce does, as DeepSpeed's stage 1. The
  // flat buffer stays, for the micro-steps to add up in before the one reduction.
  kOwnSlices,
  kPartitioned,  // stage 2: Note [Partitioned gradients]
};
GradientReduction reduction_for_zero_stage(int stage);

// Staging buffers of the ring at ZeRO-2 (Note [Partitioned gradients]): two, so that one bucket
// is collected while the previous one's reduce-scatter runs.
inline constexpr size_t kStagingBuckets = 2;

struct ReducerOptions {
  int64_t first_bucket_bytes = static_cast<int64_t>(kDefaultFirstBucketMiB * (1 << 20));
  int64_t bucket_bytes = static_cast<int64_t>(kDefaultBucketMiB * (1 << 20));
  bool overlap = true;  // start collectives from the hooks; false: all after backward
  GradientReduction reduction = GradientReduction::kAllReduce;
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
  // Registers the hooks and sets `flat`'s gradient storage (which zeroes its gradients): the
  // precision, and no full buffer where the gradients are partitioned. `flat` and `comm` must
  // outlive the reducer.
  Reducer(FlatParameters& flat, Communicator& comm, ReducerOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // The initial layout for `flat`'s parameters: buckets in reverse parameter order.
  static BucketLayout initial_layout(const std::vector<at::Tensor>& parameters,
                                     const ReducerOptions& options, int world_size);

  // Call before each backward. sync = false on micro-steps inside a gradient-accumulation
  // window: no collective starts, and gradients accumulate in the parameters' `.grad` (or, with
  // fp32 accumulation, each bucket is collected into the fp32 sum as it completes); except with
  // partitioned gradients, which are reduced at every micro-step (Note [Partitioned gradients]).
  void begin_backward(bool sync);
  // After a backward that reduces: starts what has not started, waits for all. Returns the time
  // spent waiting (exposed communication), in milliseconds. After a micro-step inside the window
  // that does not: collects what fp32 accumulation has not collected yet; returns 0.
  double finish_backward();
  // Forgets a backward that will not finish (Note [Failed capture] in step_graph.h: a CUDA graph
  // capture that threw inside it): the collectives it started are dropped (reducer.cpp says how
  // their Works end), its buckets' bookkeeping is cleared, and the gradients are zeroed, with
  // every `.grad` it left dropped (FlatParameters::zero_grads), as before a backward. The next
  // backward then begins as if this one had never run. Collective where collectives started.
  void discard_backward();

  // ZeRO-2: this rank's slice of every bucket, reduced (the layout's partition order; Note
  // [Partitioned gradients]). With one rank, the flat gradient buffer itself.
  at::Tensor& partition_grads() { return partition_grads_; }

  // Partitioned: each staging buffer's elements (Note [Partitioned gradients]); else 0.
  int64_t staging_numel() const { return staging_.empty() ? 0 : staging_numel_; }

  // This rank's partition of the current layout (its slice of every bucket).
  const Partition& partition() const { return partition_; }
  // Every rank's slice of every bucket of `flat_layout` (a tensor laid out like the flat
  // buffers) to every rank, in place: after each rank has written its own slices (the ZeRO
  // optimizer's updated parameters). Nothing to do with one rank. Collective.
  void all_gather_slices(at::Tensor& flat_layout);

  // After the first synchronised backward: rebuilds the buckets in rank 0's observed ready
  // order, moving the flat buffers into that layout, with the observer (if any) told before and
  // after. Returns whether the layout changed (nothing happens when it did not). The layout is
  // final after the first call: later ones change nothing and return false. Collective.
  bool rebuild_buckets();
  // Whether rebuild_buckets has run: the layout stays as it is (a CUDA graph may hold it).
  bool layout_final() const { return layout_final_; }
  // The one observer of re-layouts; it must outlive the reducer or stop observing first.
  void observe_layout(LayoutObserver* observer) { layout_observer_ = observer; }
  void stop_observing_layout(const LayoutObserver* observer) {
    if (layout_observer_ == observer) layout_observer_ = nullptr;
  }

  // Of the last backward that reduced.
  const std::vector<ReducerEvent>& events() const { return events_; }
  // Bytes handed to collectives in the last backward (padded bucket sizes; 0 where it did not
  // reduce).
  int64_t bytes_last_backward() const { return bytes_last_backward_; }
  // From the first collective's start to the last one's observed completion in the last
  // backward, milliseconds (0 where it did not reduce).
  double comm_span_ms() const { return comm_span_ms_; }
  size_t num_buckets() const { return flat_.layout().buckets.size(); }
  // Bytes of gradient storage this rank holds: the flat buffer and a separate fp32 accumulation
  // buffer (Note [Gradient precision]); or, partitioned, the partition and the staging ring.
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
  // Note [Partitioned gradients]: the bucket through the staging ring (in chunks where it is
  // larger than a staging buffer) into this rank's partition.
  void start_partitioned(size_t bucket, const std::string& label);
  // The staging buffer for the next collective, once the one before it in the ring is done.
  at::Tensor next_staging();
  // Reduce-scatters `input` (size() pieces of `numel`) into the partition's elements from
  // `partition_offset` on: written there, or staged in place and added or cast there later.
  void reduce_scatter_into_partition(const at::Tensor& input, int64_t partition_offset,
                                     int64_t numel, const std::string& label);
  // Waits for the collectives in flight up to (not including) in_flight_[count] that have not
  // finished yet, in order, and adds their staged results into the partition.
  void finish_in_flight(size_t count);
  double now_ms() const;
  // Note [Partitioned gradients]: ZeRO-2 with several ranks.
  bool partitions_gradients() const;
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
  // A collective (of a bucket, or of a chunk of one); `staged`: where it leaves this rank's
  // piece when that is still to be added or cast into `destination`, the partition's elements
  // (Note [Partitioned gradients]); else both undefined.
  struct InFlight {
    Work work;
    at::Tensor staged;
    at::Tensor destination;
  };
  std::vector<InFlight> in_flight_;  // in the order they started
  size_t finished_ = 0;              // in_flight_'s entries waited for
  bool reducing_ = false;    // this backward's buckets start collectives
  bool collecting_ = false;  // this backward's hooks count ready parameters (reducing, fp32 sums)
  bool in_backward_ = false;
  // Partitioned: a micro-step of the current window has reduced into the partition already, so
  // the next one adds into it; this backward adds (Note [Partitioned gradients]).
  bool window_open_ = false;
  bool adds_into_partition_ = false;
  at::Tensor partition_grads_;
  std::vector<at::Tensor> staging_;  // partitioned: the ring of kStagingBuckets buffers
  int64_t staging_numel_ = 0;        // each one's elements
  Partition partition_;
  LayoutObserver* layout_observer_ = nullptr;
  bool layout_final_ = false;
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

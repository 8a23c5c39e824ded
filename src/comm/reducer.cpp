#include "hpc_train/comm/reducer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <string>

#include "hpc_train/error.h"
#include "hpc_train/runtime/test_hooks.h"
#include "hpc_train/monitor/metrics.h"

namespace hpc_train {

std::string ReducerEvent::describe() const {
  switch (kind) {
    case Kind::kCollectiveStarted: return "bucket " + std::to_string(bucket) + " started";
    case Kind::kBackwardEnded: return "backward ended";
    case Kind::kAllDone: return "all done";
  }
  return "unknown event";
}

namespace {

int dtype_id(const at::Tensor& t) { return static_cast<int>(t.scalar_type()); }

}  // namespace

GradientReduction reduction_for_zero_stage(int stage) {
  if (stage == 2) return GradientReduction::kPartitioned;
  return stage == 1 ? GradientReduction::kOwnSlices : GradientReduction::kAllReduce;
}

// Runs after the parameter's AccumulateGrad node has put this backward's gradient in its `.grad`
// (Note [Flat parameter storage]).
class Reducer::ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(Reducer* reducer, int parameter) : reducer_(reducer), parameter_(parameter) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    reducer_->mark_ready(parameter_);
    return outputs;
  }

 private:
  Reducer* reducer_;
  int parameter_;
};

// A bucket's size is the bytes its collective moves (--bucket-mb), so fp32 reduction of a 16-bit
// model's gradients (Note [Gradient precision]) fits half as many elements in a bucket.
int Reducer::gradient_element_bytes(const at::Tensor& parameter, const ReducerOptions& options) {
  const int model_bytes = static_cast<int>(parameter.element_size());
  return options.precision.reduce_fp32 ? std::max(model_bytes, 4) : model_bytes;
}

BucketLayout Reducer::initial_layout(const std::vector<at::Tensor>& parameters,
                                     const ReducerOptions& options, int world_size) {
  std::vector<BucketParameter> reverse_order;
  std::vector<int64_t> numels;
  for (int i = static_cast<int>(parameters.size()) - 1; i >= 0; --i)
    reverse_order.push_back({i, parameters[i].numel(),
                             gradient_element_bytes(parameters[i], options),
                             dtype_id(parameters[i])});
  for (const at::Tensor& p : parameters) numels.push_back(p.numel());
  return make_bucket_layout(
      assign_buckets(reverse_order, options.first_bucket_bytes, options.bucket_bytes), numels,
      world_size);
}

Reducer::Reducer(FlatParameters& flat, Communicator& comm, ReducerOptions options)
    : flat_(flat), comm_(comm), options_(options),
      test_fail_capture_(test_fault("capture", comm.rank())) {
  const std::vector<at::Tensor>& parameters = flat_.parameters();
  hook_keys_.reserve(parameters.size());
  for (size_t i = 0; i < parameters.size(); ++i) {
    std::shared_ptr<torch::autograd::Node> accumulator =
        torch::autograd::impl::grad_accumulator(parameters[i]);
    if (!accumulator) throw Error("reducer: parameter " + flat_.names()[i] + " needs no gradient");
    hook_keys_.push_back(
        accumulator->add_post_hook(std::make_unique<ReadyHook>(this, static_cast<int>(i))));
    accumulators_.push_back(accumulator);
  }
  // Note [Gradient precision], Note [Partitioned gradients]
  flat_.set_gradient_storage(options_.precision, !partitions_gradients());
  reset_buckets();
}

Reducer::~Reducer() {
  // The accumulators outlive us (the parameters hold them): unhook, so no hook calls a dead
  // reducer. Pending collectives wait in their own destructors.
  for (size_t i = 0; i < accumulators_.size(); ++i)
    std::static_pointer_cast<torch::autograd::Node>(accumulators_[i])->del_post_hook(hook_keys_[i]);
}

void Reducer::reset_buckets() {
  const BucketLayout& layout = flat_.layout();
  bucket_of_.assign(flat_.parameters().size(), -1);
  for (size_t b = 0; b < layout.buckets.size(); ++b)
    for (int p : layout.buckets[b].parameters) bucket_of_[p] = static_cast<int>(b);
  partition_ = partition_of(layout, comm_.rank());
  partition_grads_ = at::Tensor();
  staging_.clear();
  if (options_.reduction != GradientReduction::kPartitioned) return;
  // In a world of one a rank's slice of a bucket is the whole bucket, and the partition order is
  // the flat order: the partition is the flat gradient buffer, which no collective touches, with
  // no second buffer and no copy (through NCCL an out-of-place one-rank reduce-scatter is a copy,
  // a noticeable share of a small network's step: bench/results-notes.md, reducer.cpp in-place
  // reduce-scatter).
  if (!partitions_gradients()) {
    partition_grads_ = flat_.grads();
    return;
  }
  // Note [Partitioned gradients]: the staging buffers hold what the collectives move; the
  // partition adds up a window in fp32 where asked to.
  const at::ScalarType model_dtype = flat_.values().scalar_type();
  const at::ScalarType reduced_dtype = options_.precision.reduce_fp32 ? at::kFloat : model_dtype;
  const at::ScalarType partition_dtype =
      options_.precision.accumulate_fp32 ? at::kFloat : reduced_dtype;
  partition_grads_ =
      at::zeros({layout.partition_numel}, flat_.values().options().dtype(partition_dtype));
  // A staging buffer holds a bucket of the cap, or one of several parameters (which may pass the
  // cap by its alignment gaps and padding); a parameter larger than the cap, alone in its bucket,
  // goes through in chunks (start_partitioned).
  const int64_t granule = comm_.size() * kSlotAlignmentElements;
  const int64_t cap_numel = std::max<int64_t>(
      granule, (options_.bucket_bytes / at::elementSize(reduced_dtype)) / granule * granule);
  staging_numel_ = 0;
  for (size_t b = 0; b < layout.spans.size(); ++b) {
    const int64_t padded = layout.spans[b].padded_numel;
    staging_numel_ = std::max(staging_numel_, layout.buckets[b].parameters.size() > 1
                                                  ? padded
                                                  : std::min(padded, cap_numel));
  }
  for (size_t i = 0; i < std::min(kStagingBuckets, layout.spans.size()); ++i)
    staging_.push_back(at::empty({staging_numel_}, flat_.values().options().dtype(reduced_dtype)));
}

bool Reducer::partitions_gradients() const {
  return options_.reduction == GradientReduction::kPartitioned && comm_.size() > 1;
}

double Reducer::now_ms() const { return backward_clock_.elapsed_ms(); }

void Reducer::begin_backward(bool sync) {
  if (!in_flight_.empty()) throw Error("reducer: a backward began while collectives are in flight");
  in_backward_ = true;
  bytes_last_backward_ = 0;
  comm_span_ms_ = 0.0;
  // Note [Partitioned gradients]: partitioned gradients are reduced at every micro-step, into
  // the partition at the window's first and added to it at the others.
  reducing_ = sync || partitions_gradients();
  adds_into_partition_ = window_open_;
  window_open_ = partitions_gradients() && !sync;
  // Note [Gradient precision]: with fp32 accumulation, micro-steps inside the window collect
  // their buckets too.
  collecting_ = reducing_ || flat_.collects_every_micro_step();
  if (!collecting_) return;
  const BucketLayout& layout = flat_.layout();
  pending_.clear();
  for (const Bucket& bucket : layout.buckets)
    pending_.push_back(static_cast<int>(bucket.parameters.size()));
  ready_.assign(flat_.parameters().size(), false);
  if (!reducing_) return;
  ready_order_.clear();
  next_bucket_ = 0;
  events_.clear();
  bytes_last_backward_ = 0;
  backward_clock_.restart();
  first_start_ms_ = -1.0;
}

void Reducer::mark_ready(int parameter) {
  if (!in_backward_ || !collecting_ || ready_[parameter]) return;
  ready_[parameter] = true;
  if (!reducing_) {
    // Inside the window (fp32 accumulation): into the sum at once, in any order, since no
    // collective starts; autograd's 16-bit tensors are freed early, as at the last micro-step.
    const int bucket = bucket_of_[parameter];
    if (--pending_[bucket] == 0) flat_.collect_grads(bucket);
    return;
  }
  ready_order_.push_back(parameter);
  if (--pending_[bucket_of_[parameter]] == 0 && options_.overlap) start_ready_buckets();
  if (test_fail_capture_ && next_bucket_ > 0 && comm_.capturing())
    throw Error("test fault capture: the captured backward fails after " +
                std::to_string(next_bucket_) + " of " + std::to_string(pending_.size()) +
                " buckets started");
  // MPI progresses non-blocking collectives only inside MPI calls: let the earlier ones move.
  for (size_t i = finished_; i < in_flight_.size(); ++i) in_flight_[i].work.test();
}

void Reducer::start_ready_buckets() {
  while (next_bucket_ < pending_.size() && pending_[next_bucket_] == 0) start_bucket(next_bucket_++);
}

void Reducer::start_bucket(size_t bucket) {
  const BucketLayout::Span& span = flat_.layout().spans[bucket];
  const double t = now_ms();
  if (first_start_ms_ < 0) first_start_ms_ = t;
  events_.push_back({ReducerEvent::Kind::kCollectiveStarted, static_cast<int>(bucket), t});
  // Names the bucket if its collective stalls (Note [Communication watchdog] in comm.h).
  const std::string label = "bucket " + std::to_string(bucket);
  if (partitions_gradients()) {
    start_partitioned(bucket, label);
    return;
  }
  flat_.collect_grads(bucket);
  flat_.finish_accumulation(bucket);  // Note [Gradient precision]
  at::Tensor grads = flat_.bucket_view(flat_.grads(), bucket);
  bytes_last_backward_ += span.padded_numel * static_cast<int64_t>(grads.element_size());
  // A world of one: its gradients are their own sum, and its slice of a bucket is the whole
  // bucket, in place (reset_buckets). No collective runs, whatever the backend: NCCL ran each one
  // as a kernel and two cross-stream events, in every step (and every replay of the graph).
  if (comm_.size() == 1) return;
  InFlight collective;
  if (options_.reduction == GradientReduction::kAllReduce) {
    collective.work = comm_.all_reduce(grads, ReduceOp::kSum, label);
  } else {  // kOwnSlices: this rank's slice of the bucket, in place
    at::Tensor own_slice = grads.narrow(0, comm_.rank() * span.slice_numel, span.slice_numel);
    collective.work = comm_.reduce_scatter(grads, own_slice, ReduceOp::kSum, label);
  }
  in_flight_.push_back(std::move(collective));
}

// Note [Partitioned gradients]
void Reducer::start_partitioned(size_t bucket, const std::string& label) {
  const BucketLayout::Span& span = flat_.layout().spans[bucket];
  bytes_last_backward_ += span.padded_numel * static_cast<int64_t>(staging_[0].element_size());
  if (span.padded_numel <= staging_numel_) {
    const at::Tensor grads = flat_.collect_grads_into(bucket, next_staging());
    reduce_scatter_into_partition(grads, span.partition_offset, span.slice_numel, label);
    return;
  }
  // A parameter larger than the bucket cap, alone in its bucket (assign_buckets), larger than a
  // staging buffer: chunk c holds elements [c x chunk, (c + 1) x chunk) of every rank's slice of
  // the bucket, side by side, and is reduce-scattered into that piece of each rank's slice.
  const std::vector<int>& members = flat_.layout().buckets[bucket].parameters;
  if (members.size() != 1)
    throw Error("reducer: " + label + " holds " + std::to_string(members.size()) +
                " parameters and exceeds the staging buffers");
  const at::Tensor gradient = flat_.take_grad_in_slot_order(members[0]);
  // The bucket's element e is the gradient's element e - lead (0 for a bucket's first slot).
  const int64_t lead = flat_.layout().slots[members[0]].offset - span.offset;
  const int64_t ranks = comm_.size();
  const int64_t chunk = staging_numel_ / ranks / kSlotAlignmentElements * kSlotAlignmentElements;
  const int64_t chunks = (span.slice_numel + chunk - 1) / chunk;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t first = c * chunk;
    const int64_t numel = std::min(chunk, span.slice_numel - first);
    at::Tensor staged = next_staging().narrow(0, 0, ranks * numel);
    staged.zero_();  // the bucket's padding, and all of it where backward left no gradient
    for (int64_t r = 0; gradient.defined() && r < ranks; ++r) {
      const int64_t piece = r * span.slice_numel + first - lead;  // in the gradient's elements
      const int64_t begin = std::max<int64_t>(piece, 0);
      const int64_t end = std::min<int64_t>(piece + numel, gradient.numel());
      if (end > begin)
        staged.narrow(0, r * numel + (begin - piece), end - begin)
            .copy_(gradient.narrow(0, begin, end - begin));
    }
    reduce_scatter_into_partition(staged, span.partition_offset + first, numel,
                                  label + ", chunk " + std::to_string(c + 1) + " of " +
                                      std::to_string(chunks));
  }
}

at::Tensor Reducer::next_staging() {
  // Staging buffer i % kStagingBuckets was last the input of collective i - kStagingBuckets,
  // which must be done with it.
  const size_t use = in_flight_.size();
  if (use >= staging_.size()) finish_in_flight(use - staging_.size() + 1);
  return staging_[use % staging_.size()];
}

void Reducer::reduce_scatter_into_partition(const at::Tensor& input, int64_t partition_offset,
                                            int64_t numel, const std::string& label) {
  InFlight collective;
  at::Tensor slice = partition_grads_.narrow(0, partition_offset, numel);
  if (!adds_into_partition_ && slice.scalar_type() == input.scalar_type()) {
    collective.work = comm_.reduce_scatter(input, slice, ReduceOp::kSum, label);
  } else {
    // In place into this rank's own piece of the input, added (or cast) into the partition
    // once the collective has finished (finish_in_flight).
    at::Tensor own = input.narrow(0, comm_.rank() * numel, numel);
    collective.work = comm_.reduce_scatter(input, own, ReduceOp::kSum, label);
    collective.staged = own;
    collective.destination = slice;
  }
  in_flight_.push_back(std::move(collective));
}

void Reducer::finish_in_flight(size_t count) {
  for (; finished_ < std::min(count, in_flight_.size()); ++finished_) {
    InFlight& collective = in_flight_[finished_];
    collective.work.wait();
    if (!collective.staged.defined()) continue;
    if (adds_into_partition_) collective.destination.add_(collective.staged);
    else collective.destination.copy_(collective.staged);
    collective.staged = collective.destination = at::Tensor();
  }
}

double Reducer::finish_backward() {
  in_backward_ = false;
  if (!reducing_) {
    // Buckets with a parameter that got no gradient (unused) are still incomplete: collect what
    // did arrive into the fp32 sum.
    if (collecting_)
      for (size_t b = 0; b < pending_.size(); ++b)
        if (pending_[b] > 0) flat_.collect_grads(b);
    return 0.0;
  }
  events_.push_back({ReducerEvent::Kind::kBackwardEnded, -1, now_ms()});
  const Stopwatch wait;
  // Buckets whose parameters got no gradient this step (unused) start now, in order.
  for (size_t b = next_bucket_; b < pending_.size(); ++b) pending_[b] = 0;
  start_ready_buckets();
  finish_in_flight(in_flight_.size());
  in_flight_.clear();
  finished_ = 0;
  const double done = now_ms();
  events_.push_back({ReducerEvent::Kind::kAllDone, -1, done});
  comm_span_ms_ = first_start_ms_ >= 0 ? done - first_start_ms_ : 0.0;
  return wait.elapsed_ms();
}

void Reducer::discard_backward() {
  // The collectives go with their Works. A Work's destructor waits for its collective where it
  // can: an MPI one completes, every rank having started it alike; a captured NCCL one never ran,
  // and the wait's CUDA call fails, which the destructor swallows (StepGraph::capture clears
  // CUDA's last error after a failed capture).
  in_flight_.clear();
  finished_ = 0;
  in_backward_ = false;
  reducing_ = false;
  collecting_ = false;
  // The window starts afresh, as the flat buffer does below (a micro-step's partial sum in the
  // partition goes with it).
  window_open_ = false;
  adds_into_partition_ = false;
  if (partitions_gradients()) partition_grads_.zero_();
  pending_.clear();
  ready_.clear();
  ready_order_.clear();
  next_bucket_ = 0;
  // The buckets that started collected their gradients into the flat buffer and the others'
  // are still in `.grad`: neither may reach the next step.
  flat_.zero_grads();
}

BucketLayout Reducer::rebuilt_layout() {
  const std::vector<at::Tensor>& parameters = flat_.parameters();
  // Parameters that never became ready keep their place at the end, in reverse order.
  std::vector<int> order = ready_order_;
  std::vector<bool> seen(parameters.size(), false);
  for (int p : order) seen[p] = true;
  for (int i = static_cast<int>(parameters.size()) - 1; i >= 0; --i)
    if (!seen[i]) order.push_back(i);
  // Rank 0's order, so that every rank rebuilds alike (control data: over MPI on the host).
  comm_.broadcast_ints(order, 0, "bucket order");
  std::vector<BucketParameter> ready_order;
  std::vector<int64_t> numels;
  for (int p : order) {
    ready_order.push_back({p, parameters[p].numel(), gradient_element_bytes(parameters[p], options_),
                           dtype_id(parameters[p])});
  }
  for (const at::Tensor& p : parameters) numels.push_back(p.numel());
  return make_bucket_layout(
      assign_buckets(ready_order, options_.first_bucket_bytes, options_.bucket_bytes), numels,
      comm_.size());
}

bool Reducer::rebuild_buckets() {
  if (layout_final_) return false;
  layout_final_ = true;
  BucketLayout layout = rebuilt_layout();
  const BucketLayout& current = flat_.layout();
  bool same = layout.buckets.size() == current.buckets.size();
  for (size_t b = 0; same && b < layout.buckets.size(); ++b)
    same = layout.buckets[b].parameters == current.buckets[b].parameters;
  if (same) return false;
  if (layout_observer_) layout_observer_->before_relayout();
  flat_.relayout(std::move(layout));
  reset_buckets();
  if (layout_observer_) layout_observer_->after_relayout();
  return true;
}

void Reducer::all_gather_slices(at::Tensor& flat_layout) {
  if (comm_.size() == 1) return;  // its slices are the whole buckets
  std::vector<Work> gathers;
  for (size_t b = 0; b < flat_.layout().spans.size(); ++b) {
    at::Tensor bucket = flat_.bucket_view(flat_layout, b);
    gathers.push_back(comm_.all_gather_in_place(bucket));
  }
  for (Work& work : gathers) work.wait();
}

int64_t Reducer::gradient_bytes() const {
  int64_t bytes = flat_.gradient_bytes();
  if (!partitions_gradients()) return bytes;
  bytes += partition_grads_.numel() * partition_grads_.element_size();
  for (const at::Tensor& staging : staging_) bytes += staging.numel() * staging.element_size();
  return bytes;
}

}  // namespace hpc_train

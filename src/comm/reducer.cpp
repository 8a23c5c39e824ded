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
  flat_.set_gradient_precision(options_.precision);  // Note [Gradient precision]
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
  if (!options_.reduce_scatter) return;
  // In a world of one a rank's slice of a bucket is the whole bucket, and the partition order is
  // the flat order: the reduce-scatter runs in place on the flat gradients, with no second
  // buffer and no copy (through NCCL an out-of-place one-rank reduce-scatter is a copy, a
  // noticeable share of a small network's step: bench/results-notes.md, reducer.cpp in-place
  // reduce-scatter).
  partition_grads_ = comm_.size() == 1
                         ? flat_.grads()
                         : at::zeros({layout.partition_numel}, flat_.grads().options());
}

bool Reducer::partition_is_separate() const {
  return partition_grads_.defined() && !partition_grads_.is_same(flat_.grads());
}

double Reducer::now_ms() const { return backward_clock_.elapsed_ms(); }

void Reducer::begin_backward(bool sync) {
  if (!in_flight_.empty()) throw Error("reducer: a backward began while collectives are in flight");
  sync_ = sync;
  in_backward_ = true;
  // Note [Gradient precision]: with fp32 accumulation, micro-steps inside the window collect
  // their buckets too.
  collecting_ = sync || flat_.collects_every_micro_step();
  if (!collecting_) return;
  const BucketLayout& layout = flat_.layout();
  pending_.clear();
  for (const Bucket& bucket : layout.buckets)
    pending_.push_back(static_cast<int>(bucket.parameters.size()));
  ready_.assign(flat_.parameters().size(), false);
  if (!sync) return;
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
  if (!sync_) {
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
  for (Work& work : in_flight_) work.test();
}

void Reducer::start_ready_buckets() {
  while (next_bucket_ < pending_.size() && pending_[next_bucket_] == 0) start_bucket(next_bucket_++);
}

void Reducer::start_bucket(size_t bucket) {
  const BucketLayout::Span& span = flat_.layout().spans[bucket];
  const double t = now_ms();
  if (first_start_ms_ < 0) first_start_ms_ = t;
  events_.push_back({ReducerEvent::Kind::kCollectiveStarted, static_cast<int>(bucket), t});
  flat_.collect_grads(bucket);
  flat_.finish_accumulation(bucket);  // Note [Gradient precision]
  bytes_last_backward_ += span.padded_numel * static_cast<int64_t>(flat_.grads().element_size());
  // A world of one: its gradients are their own sum, and its slice of a bucket is the whole
  // bucket, in place (reset_buckets). No collective runs, whatever the backend: NCCL ran each one
  // as a kernel and two cross-stream events, in every step (and every replay of the graph).
  if (comm_.size() == 1) return;
  at::Tensor grads = flat_.bucket_view(flat_.grads(), bucket);
  // Names the bucket if this collective stalls (Note [Communication watchdog] in comm.h).
  const std::string label = "bucket " + std::to_string(bucket);
  if (options_.reduce_scatter) {
    at::Tensor slice = partition_grads_.narrow(0, span.partition_offset, span.slice_numel);
    in_flight_.push_back(comm_.reduce_scatter(grads, slice, ReduceOp::kSum, label));
  } else {
    in_flight_.push_back(comm_.all_reduce(grads, ReduceOp::kSum, label));
  }
}

double Reducer::finish_backward() {
  in_backward_ = false;
  if (!sync_) {
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
  for (Work& work : in_flight_) work.wait();
  in_flight_.clear();
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
  in_backward_ = false;
  sync_ = false;
  collecting_ = false;
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
  if (partition_is_separate()) bytes += partition_grads_.numel() * partition_grads_.element_size();
  return bytes;
}

}  // namespace hpc_train

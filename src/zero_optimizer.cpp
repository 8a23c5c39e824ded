#include "hpc_train/zero_optimizer.h"

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "hpc_train/error.h"
#include "hpc_train/metrics.h"

namespace hpc_train {

namespace {

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

}  // namespace

ZeroOptimizer::ZeroOptimizer(FlatParameters& flat, Reducer& reducer, Communicator& comm,
                             ZeroOptions options)
    : flat_(flat), reducer_(reducer), comm_(comm), options_(options) {
  if (options_.stage < 0 || options_.stage > 2)
    throw ConfigError("--zero-stage " + std::to_string(options_.stage) + ": use 0, 1 or 2");
  FullOptimizerState initial;
  initial.master = flat_.to_logical(flat_.values()).to(at::kFloat);
  initial.exp_avg = at::zeros_like(initial.master);
  initial.exp_avg_sq = at::zeros_like(initial.master);
  load_full_state(initial);
}

bool ZeroOptimizer::separate_master() const {
  return flat_.values().scalar_type() != at::kFloat;
}

at::Tensor ZeroOptimizer::own_slice(const at::Tensor& flat, size_t b) const {
  const BucketLayout::Span& span = flat_.layout().spans[b];
  return flat.narrow(0, span.offset + comm_.rank() * span.slice_numel, span.slice_numel);
}

at::Tensor ZeroOptimizer::partition_slice(const at::Tensor& partition, size_t b) const {
  const BucketLayout::Span& span = flat_.layout().spans[b];
  return partition.narrow(0, span.partition_offset, span.slice_numel);
}

at::Tensor ZeroOptimizer::gradient_partition() {
  if (options_.stage == 0) return flat_.grads().to(at::kFloat);
  if (options_.stage == 2) return reducer_.partition_grads().to(at::kFloat);
  std::vector<at::Tensor> slices;
  for (size_t b = 0; b < flat_.layout().spans.size(); ++b)
    slices.push_back(own_slice(flat_.grads(), b));
  return at::cat(slices).to(at::kFloat);
}

StepOutcome ZeroOptimizer::step(double lr, double loss_scale) {
  StepOutcome outcome;
  at::Tensor grads = gradient_partition();
  // The global norm: partitions are disjoint, so their squared norms add up. In stage 0 every
  // rank holds the whole reduced gradient. An inf or nan anywhere makes the sum inf or nan.
  const double local_norm = grads.norm().item<double>();
  double squared = local_norm * local_norm;
  if (partitioned()) squared = comm_.all_reduce_scalar(squared);
  if (options_.check_overflow) {
    // Agreed explicitly: every rank must skip the same steps.
    const int64_t local_overflow = std::isfinite(squared) ? 0 : 1;
    outcome.overflow = comm_.all_reduce_count(local_overflow, ReduceOp::kMax) != 0;
    if (outcome.overflow) return outcome;
  }
  outcome.grad_norm = std::sqrt(squared) / loss_scale;
  double multiplier = 1.0 / loss_scale;
  if (options_.clip_grad > 0.0) {
    // torch.nn.utils.clip_grad_norm_'s rule.
    const double clip_coefficient = options_.clip_grad / (outcome.grad_norm + 1e-6);
    if (clip_coefficient < 1.0) multiplier *= clip_coefficient;
  }
  if (multiplier != 1.0) grads.mul_(multiplier);
  ++steps_;

  if (!partitioned()) {
    at::Tensor target = master_.defined() ? master_ : flat_.values();
    adam_update(target, grads, exp_avg_, exp_avg_sq_, steps_, lr, options_.adam);
    if (master_.defined()) flat_.values().copy_(master_);
    return outcome;
  }
  const size_t buckets = flat_.layout().spans.size();
  for (size_t b = 0; b < buckets; ++b) {
    at::Tensor target = master_.defined() ? partition_slice(master_, b) : own_slice(flat_.values(), b);
    adam_update(target, partition_slice(grads, b), partition_slice(exp_avg_, b),
                partition_slice(exp_avg_sq_, b), steps_, lr, options_.adam);
    if (master_.defined()) own_slice(flat_.values(), b).copy_(target);
  }
  const Stopwatch gather;
  std::vector<Work> gathers;
  for (size_t b = 0; b < buckets; ++b) {
    at::Tensor bucket = flat_.bucket_view(flat_.values(), b);
    gathers.push_back(comm_.all_gather_in_place(bucket));
  }
  for (Work& work : gathers) work.wait();
  outcome.gather_ms = gather.elapsed_ms();
  return outcome;
}

int64_t ZeroOptimizer::state_bytes() const {
  return bytes_of(master_) + bytes_of(exp_avg_) + bytes_of(exp_avg_sq_);
}

at::Tensor ZeroOptimizer::assemble_full(const at::Tensor& partition) {
  at::Tensor full = at::zeros({flat_.layout().total_numel}, partition.options());
  const size_t buckets = flat_.layout().spans.size();
  for (size_t b = 0; b < buckets; ++b) own_slice(full, b).copy_(partition_slice(partition, b));
  std::vector<Work> gathers;
  for (size_t b = 0; b < buckets; ++b) {
    at::Tensor bucket = flat_.bucket_view(full, b);
    gathers.push_back(comm_.all_gather_in_place(bucket));
  }
  for (Work& work : gathers) work.wait();
  return full;
}

FullOptimizerState ZeroOptimizer::gather_full_state() {
  FullOptimizerState state;
  state.steps = steps_;
  auto logical = [&](const at::Tensor& t) {
    return flat_.to_logical(partitioned() ? assemble_full(t) : t);
  };
  state.master = master_.defined() ? logical(master_)
                                   : flat_.to_logical(flat_.values()).to(at::kFloat);
  state.exp_avg = logical(exp_avg_);
  state.exp_avg_sq = logical(exp_avg_sq_);
  return state;
}

void ZeroOptimizer::load_full_state(const FullOptimizerState& state) {
  auto local = [&](const at::Tensor& logical) {
    at::Tensor full = flat_.from_logical(logical.to(at::kFloat));
    if (!partitioned()) return full;
    std::vector<at::Tensor> slices;
    for (size_t b = 0; b < flat_.layout().spans.size(); ++b) slices.push_back(own_slice(full, b));
    return at::cat(slices);
  };
  steps_ = state.steps;
  exp_avg_ = local(state.exp_avg);
  exp_avg_sq_ = local(state.exp_avg_sq);
  master_ = separate_master() ? local(state.master) : at::Tensor();
  // The parameters follow the master weights (a no-op right after construction or re-layout).
  flat_.values().copy_(flat_.from_logical(state.master).to(flat_.values().scalar_type()));
}

}  // namespace hpc_train

#include "hpc_train/zero_optimizer.h"

#include <ATen/ATen.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "hpc_train/error.h"
#include "hpc_train/metrics.h"

#ifdef HPC_TRAIN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstring>

#include "hpc_train/fused_optimizer.h"
#endif

namespace hpc_train {

namespace {

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

[[noreturn]] void no_gpu(const char* method) {
  throw Error(std::string("ZeroOptimizer::") + method +
              ": the parameters are on the CPU; the device step needs them on a GPU (a build "
              "with CUDA); on the CPU use step()");
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(FlatParameters& flat, Reducer& reducer, Communicator& comm,
                             ZeroOptions options)
    : flat_(flat), reducer_(reducer), comm_(comm), options_(options) {
  if (options_.stage < 0 || options_.stage > 2)
    throw ConfigError("--zero-stage " + std::to_string(options_.stage) + ": use 0, 1 or 2");
  if (options_.loss_scaling && !options_.check_overflow)
    throw ConfigError("ZeroOptions: fp16 loss scaling needs check_overflow, so that an "
                      "overflowed step is skipped");
  if (on_device()) create_device_buffers();
  else if (options_.loss_scaling) host_scaler_.emplace(*options_.loss_scaling);
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

at::Tensor ZeroOptimizer::scale_loss(const at::Tensor& loss, double averaging) const {
  if (on_device() && options_.loss_scaling) return loss * (loss_scale_ * averaging);
  return loss * ((host_scaler_ ? host_scaler_->scale() : 1.0) * averaging);
}

void ZeroOptimizer::step() {
  if (on_device()) {
    step_on_device();
  } else {
    // Note [Schedule step]: the schedule is evaluated at the steps applied so far.
    const LrScheduleParams schedule = options_.lr_schedule.value_or(
        LrScheduleParams{LrScheduleKind::kConstant, WarmupType::kLinear, options_.adam.lr});
    host_last_lr_ = lr_at(schedule, steps_);
    host_last_outcome_ = step(host_last_lr_, host_scaler_ ? host_scaler_->scale() : 1.0);
    ++host_global_step_;
    if (host_scaler_) host_scaler_->update(host_last_outcome_.overflow);
  }
  flat_.zero_grads();
}

StepReport ZeroOptimizer::report() const {
  if (on_device()) return read_device_report();
  StepReport report;
  report.global_step = host_global_step_;
  report.adam_steps = steps_;
  report.skipped_steps = host_global_step_ - steps_;
  report.loss_scale = host_scaler_ ? host_scaler_->scale() : 1.0;
  report.last_grad_norm = host_last_outcome_.grad_norm;
  report.last_lr = host_last_lr_;
  report.last_overflow = host_last_outcome_.overflow;
  if (host_scaler_) report.scaler = host_scaler_->state();
  return report;
}

void ZeroOptimizer::resume(int64_t global_step, int64_t adam_steps, const LossScalerState& scaler) {
  if (on_device()) {
    load_device_state(global_step, adam_steps, scaler);
    return;
  }
  host_global_step_ = global_step;
  steps_ = adam_steps;
  if (host_scaler_) host_scaler_->restore(scaler);
}

int64_t ZeroOptimizer::steps_taken() const {
  return on_device() ? read_device_report().adam_steps : steps_;
}

double ZeroOptimizer::all_gather_parameters() {
  // With one rank, its slices are the whole buckets already.
  if (!partitioned() || comm_.size() == 1) return 0.0;
  const Stopwatch gather;
  std::vector<Work> gathers;
  for (size_t b = 0; b < flat_.layout().spans.size(); ++b) {
    at::Tensor bucket = flat_.bucket_view(flat_.values(), b);
    gathers.push_back(comm_.all_gather_in_place(bucket));
  }
  for (Work& work : gathers) work.wait();
  return gather.elapsed_ms();
}

void ZeroOptimizer::set_lr_schedule(const LrScheduleParams& schedule) {
  options_.lr_schedule = schedule;
}

void ZeroOptimizer::step_on_device() {
  if (!on_device()) no_gpu("step_on_device");
  enqueue_device_step(nullptr);
  all_gather_parameters();
}

StepOutcome ZeroOptimizer::step(double lr, double loss_scale) {
  StepOutcome outcome;
  if (on_device()) {
    // The fused kernels with the host's inputs; an overflowed step changes nothing, so its
    // all-gather hands every rank what it holds already.
    const HostStepInputs host{lr, loss_scale};
    enqueue_device_step(&host);
    outcome.gather_ms = all_gather_parameters();
    const StepReport report = read_device_report();
    outcome.overflow = report.last_overflow;
    outcome.grad_norm = report.last_grad_norm;
    return outcome;
  }
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
  outcome.gather_ms = all_gather_parameters();
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
  state.steps = steps_taken();
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
  // A checkpoint's state may come from the host; the optimizer's lives with the parameters.
  const at::Device device = flat_.values().device();
  auto local = [&](const at::Tensor& logical) {
    at::Tensor full = flat_.from_logical(logical.to(device, at::kFloat));
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
  if (on_device()) {
    prepare_device_layout();
    const StepReport now = read_device_report();
    load_device_state(now.global_step, state.steps, now.scaler);
  }
}

bool ZeroOptimizer::rebuild_buckets() {
  BucketLayout layout = reducer_.rebuilt_layout();
  const BucketLayout& current = flat_.layout();
  bool same = layout.buckets.size() == current.buckets.size();
  for (size_t b = 0; same && b < layout.buckets.size(); ++b)
    same = layout.buckets[b].parameters == current.buckets[b].parameters;
  if (same) return false;
  const FullOptimizerState state = gather_full_state();
  flat_.relayout(std::move(layout));
  reducer_.reset_buckets();
  load_full_state(state);  // re-partitions for the new layout
  return true;
}

#ifdef HPC_TRAIN_WITH_CUDA

namespace {

FusedDtype fused_dtype(const at::Tensor& values) {
  switch (values.scalar_type()) {
    case at::kFloat: return FusedDtype::kFloat32;
    case at::kHalf: return FusedDtype::kFloat16;
    case at::kBFloat16: return FusedDtype::kBFloat16;
    default:
      throw Error(std::string("fused optimizer: no kernels for parameters of ") +
                  c10::toString(values.scalar_type()) + "; use fp32, fp16 or bf16");
  }
}

FusedStepOptions fused_step_options(const ZeroOptions& zero) {
  FusedStepOptions options;
  options.beta1 = zero.adam.beta1;
  options.beta2 = zero.adam.beta2;
  options.eps = zero.adam.eps;
  options.weight_decay = zero.adam.weight_decay;
  options.decoupled_weight_decay = zero.adam.decoupled_weight_decay;
  options.clip_grad = zero.clip_grad;
  options.check_overflow = zero.check_overflow;
  if (zero.lr_schedule) {
    options.lr_schedule = *zero.lr_schedule;
  } else {
    options.lr_schedule.kind = LrScheduleKind::kConstant;
    options.lr_schedule.lr = zero.adam.lr;
  }
  if (zero.loss_scaling) {
    const LossScalerOptions& scaling = *zero.loss_scaling;
    options.loss_scaling =
        scaling.fixed_scale > 0 ? FusedLossScaling::kFixed : FusedLossScaling::kDynamic;
    options.scale_window = scaling.scale_window;
    options.hysteresis = scaling.hysteresis;
    options.min_scale = scaling.min_scale;
  }
  return options;
}

FusedStepState read_step_state(const at::Tensor& device_state) {
  const at::Tensor bytes = device_state.cpu();  // waits for the current stream
  FusedStepState state;
  std::memcpy(&state, bytes.data_ptr(), sizeof state);
  return state;
}

void write_step_state(at::Tensor& device_state, const FusedStepState& state) {
  at::Tensor bytes = at::empty({static_cast<int64_t>(sizeof state)}, at::kByte);
  std::memcpy(bytes.data_ptr(), &state, sizeof state);
  device_state.copy_(bytes);
}

}  // namespace

void ZeroOptimizer::create_device_buffers() {
  const at::Device device = flat_.values().device();
  const at::TensorOptions on_gpu = at::TensorOptions().device(device);
  device_state_ = at::zeros({static_cast<int64_t>(sizeof(FusedStepState))}, on_gpu.dtype(at::kByte));
  loss_scale_ = at::ones({1}, on_gpu.dtype(at::kFloat));
  sum_of_squares_ = at::zeros({1}, on_gpu.dtype(at::kDouble));
  // LossScaler checks the options and knows the initial state.
  const LossScalerState scaler =
      options_.loss_scaling ? LossScaler(*options_.loss_scaling).state() : LossScalerState{};
  load_device_state(0, 0, scaler);
}

void ZeroOptimizer::prepare_device_layout() {
  const c10::cuda::CUDAGuard guard(flat_.values().device());
  const BucketLayout& layout = flat_.layout();
  std::vector<FusedSegment> segments;
  if (!partitioned()) {
    segments.push_back({layout.total_numel, 0, 0, 0});
  } else {
    for (const BucketLayout::Span& span : layout.spans) {
      if (span.slice_numel == 0) continue;
      const int64_t own = span.offset + comm_.rank() * span.slice_numel;  // as own_slice
      // Stage 2's gradients are the reducer's partition, laid out as the moments are.
      const int64_t grad_offset = options_.stage == 2 ? span.partition_offset : own;
      segments.push_back({span.slice_numel, grad_offset, span.partition_offset, own});
    }
  }
  int64_t partition_numel = 0;
  for (const FusedSegment& segment : segments) partition_numel += segment.numel;
  at::Tensor table = at::empty({static_cast<int64_t>(segments.size()), 4}, at::kLong);
  std::memcpy(table.data_ptr(), segments.data(), segments.size() * sizeof(FusedSegment));
  segments_ = table.to(flat_.values().device());
  device_grid_blocks_ = fused_grid_blocks(partition_numel);
  block_partials_ = at::empty({device_grid_blocks_},
                              at::TensorOptions().dtype(at::kDouble).device(flat_.values().device()));
}

void ZeroOptimizer::enqueue_device_step(const HostStepInputs* host_inputs) {
  const c10::cuda::CUDAGuard guard(flat_.values().device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  const FusedDtype dtype = fused_dtype(flat_.values());
  at::Tensor& grads = options_.stage == 2 ? reducer_.partition_grads() : flat_.grads();
  const auto* segments = reinterpret_cast<const FusedSegment*>(segments_.data_ptr<int64_t>());
  const int num_segments = static_cast<int>(segments_.size(0));
  launch_grad_sum_of_squares(grads.data_ptr(), dtype, segments, num_segments, device_grid_blocks_,
                             block_partials_.data_ptr<double>(),
                             sum_of_squares_.data_ptr<double>(), stream);
  // As in step(): partitions are disjoint, so their squared norms add up; in stage 0 every rank
  // holds the whole reduced gradient, and fp16 reduces only so that every rank skips the same
  // steps; the bookkeeping divides those identical copies out again.
  double sum_of_squares_copies = 1.0;
  if (comm_.size() > 1 && (partitioned() || options_.check_overflow)) {
    comm_.all_reduce(sum_of_squares_).wait();  // NCCL: the stream waits, not the host
    if (!partitioned()) sum_of_squares_copies = comm_.size();
  }
  const FusedStepOptions options = fused_step_options(options_);
  FusedHostInputs host;
  if (host_inputs) host = {host_inputs->lr, host_inputs->loss_scale};
  auto* state = reinterpret_cast<FusedStepState*>(device_state_.data_ptr());
  launch_step_bookkeeping(sum_of_squares_.data_ptr<double>(), sum_of_squares_copies,
                          options, host_inputs ? &host : nullptr, state, loss_scale_.data_ptr<float>(),
                          stream);
  launch_adam_update(grads.data_ptr(), flat_.values().data_ptr(), dtype,
                     master_.defined() ? master_.data_ptr<float>() : nullptr,
                     exp_avg_.data_ptr<float>(), exp_avg_sq_.data_ptr<float>(), segments,
                     num_segments, device_grid_blocks_, state, options, stream);
}

StepReport ZeroOptimizer::read_device_report() const {
  if (!on_device()) no_gpu("read_device_report");
  const FusedStepState state = read_step_state(device_state_);
  StepReport report;
  report.global_step = state.global_step;
  report.adam_steps = state.adam_steps;
  report.skipped_steps = state.global_step - state.adam_steps;
  report.loss_scale = state.loss_scale;
  report.last_grad_norm = state.grad_norm;
  report.last_lr = state.lr;
  report.last_overflow = state.found_inf != 0;
  report.scaler = {state.loss_scale, state.hysteresis_left, state.scaler_steps,
                   state.last_overflow_step, state.scaler_skipped_steps};
  report.scaler_failed = state.scaler_failed != 0;
  return report;
}

void ZeroOptimizer::load_device_state(int64_t global_step, int64_t adam_steps,
                                      const LossScalerState& scaler) {
  if (!on_device()) no_gpu("load_device_state");
  FusedStepState state;
  state.global_step = global_step;
  state.adam_steps = adam_steps;
  state.loss_scale = scaler.scale;
  state.hysteresis_left = scaler.hysteresis_left;
  state.scaler_steps = scaler.steps;
  state.last_overflow_step = scaler.last_overflow_step;
  state.scaler_skipped_steps = scaler.skipped_steps;
  write_step_state(device_state_, state);
  loss_scale_.fill_(scaler.scale);
}

#else  // A build without CUDA: parameters are never on a GPU, so none of these is reached.

void ZeroOptimizer::create_device_buffers() { no_gpu("create_device_buffers"); }
void ZeroOptimizer::prepare_device_layout() { no_gpu("prepare_device_layout"); }
void ZeroOptimizer::enqueue_device_step(const HostStepInputs*) { no_gpu("step"); }
StepReport ZeroOptimizer::read_device_report() const { no_gpu("read_device_report"); }
void ZeroOptimizer::load_device_state(int64_t, int64_t, const LossScalerState&) {
  no_gpu("load_device_state");
}

#endif

}  // namespace hpc_train

// The device path of ZeroOptimizer in a GPU build (zero_optimizer.h): its buffers on the
// parameters' GPU, the segment table of this rank's partition, and one step as the fused kernels
// of fused_optimizer.cu with the step state kept on the device. The CPU build's are in
// zero_optimizer_cpu.cpp.
#include "hpc_train/optim/zero_optimizer.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "hpc_train/error.h"
#include "hpc_train/optim/fused_optimizer.h"
#include "hpc_train/runtime/kernel_dtype_torch.h"

namespace hpc_train {

namespace {

KernelDtype fused_dtype(const at::Tensor& values) {
  if (const std::optional<KernelDtype> dtype = kernel_dtype_of(values.scalar_type())) return *dtype;
  throw Error(std::string("fused optimizer: no kernels for parameters of ") +
              c10::toString(values.scalar_type()) + "; use fp32, fp16 or bf16");
}

FusedStepOptions fused_step_options(const ZeroOptions& zero, bool momentum_buffer) {
  const OptimizerOptions& rule = zero.optimizer;
  FusedStepOptions options;
  switch (rule.kind) {
    case OptimizerKind::kSgd: options.rule = FusedRule::kSgd; break;
    case OptimizerKind::kLamb: options.rule = FusedRule::kLamb; break;
    case OptimizerKind::kLars: options.rule = FusedRule::kLars; break;
    default: options.rule = FusedRule::kAdam;
  }
  options.beta1 = rule.beta1;
  options.momentum = rule.momentum;
  options.dampening = rule.dampening;
  options.nesterov = rule.nesterov;
  options.ema_decay = zero.ema_decay;
  options.momentum_buffer = !rule.adam() && momentum_buffer;
  options.beta2 = rule.beta2;
  options.eps = rule.eps;
  options.weight_decay = rule.weight_decay;
  options.decoupled_weight_decay = rule.decoupled_weight_decay();
  options.trust_coefficient = rule.trust_coefficient;
  options.min_trust_ratio = rule.min_trust_ratio;
  options.max_trust_ratio = rule.max_trust_ratio;
  options.lamb_bias_correction = rule.lamb_bias_correction;
  options.clip_grad = zero.clip_grad;
  options.check_overflow = zero.check_overflow;
  if (zero.lr_schedule) {
    options.lr_schedule = *zero.lr_schedule;
  } else {
    options.lr_schedule.kind = LrScheduleKind::kConstant;
    options.lr_schedule.lr = rule.lr;
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

// Each segment costs both kernels a pass of their grid-stride loops and a scalar head and tail.
// Slices that follow each other in all three buffers are one segment: in a world of one, ZeRO's
// slices are the whole buckets, back to back, and its table is stage 0's single segment. (With
// simple_cnn's two buckets as two segments, the Adam update and the sum of squares each took
// longer than stage 0's single segment, a small but measurable share of its step:
// bench/results-notes.md, zero_optimizer_cuda.cpp segments.)
void append_segment(std::vector<FusedSegment>& segments, const FusedSegment& next) {
  if (!segments.empty()) {
    FusedSegment& last = segments.back();
    if (last.grad_offset + last.numel == next.grad_offset &&
        last.master_offset + last.numel == next.master_offset &&
        last.param_offset + last.numel == next.param_offset) {
      last.numel += next.numel;
      return;
    }
  }
  segments.push_back(next);
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
  const Partition& partition = reducer_.partition();
  std::vector<FusedSegment> segments;
  std::vector<FusedTrustSegment> trust_segments;
  // Stage 2's gradients are the reducer's partition, laid out as the moments are.
  const bool grads_in_partition = partitioned() && options_.stage == 2;
  if (options_.optimizer.layer_adaptive()) {
    // Note [Trust ratios]: a segment per parameter piece, never merged. The sums' kernel writes
    // each segment's sums to its parameter's place, so no parameter may have two here.
    std::vector<bool> seen(flat_.parameters().size(), false);
    for (const ParameterPiece& piece : parameter_pieces()) {
      if (seen[piece.parameter])
        throw Error("ZeroOptimizer: parameter " + flat_.names()[piece.parameter] +
                    " has two pieces in this rank's partition; a rank holds one slice of a "
                    "bucket, so it cannot");
      seen[piece.parameter] = true;
      segments.push_back({piece.numel, grads_in_partition ? piece.state_offset : piece.flat_offset,
                          piece.state_offset, piece.flat_offset});
      int32_t flags = decays(piece.parameter) ? kTrustDecays : 0;
      if (adapts(piece.parameter)) flags |= kTrustAdapts;
      trust_segments.push_back({piece.parameter, flags});
    }
    // A partition of padding alone (a tiny model on many ranks): one empty segment, whose sums
    // of zero go to parameter 0's place, which this rank holds nothing of.
    if (segments.empty()) {
      segments.push_back({0, 0, 0, 0});
      trust_segments.push_back({0, 0});
    }
  } else if (!partitioned()) {
    segments.push_back({partition.flat_numel, 0, 0, 0});
  } else {
    for (const Partition::Slice& slice : partition.slices) {
      const int64_t grad_offset = grads_in_partition ? slice.partition_offset : slice.flat_offset;
      append_segment(segments,
                     {slice.numel, grad_offset, slice.partition_offset, slice.flat_offset});
    }
  }
  int64_t partition_numel = 0;
  for (const FusedSegment& segment : segments) partition_numel += segment.numel;
  at::Tensor table = at::empty({static_cast<int64_t>(segments.size()), 4}, at::kLong);
  std::memcpy(table.data_ptr(), segments.data(), segments.size() * sizeof(FusedSegment));
  segments_ = table.to(flat_.values().device());
  device_grid_blocks_ = fused_grid_blocks(partition_numel);
  const at::TensorOptions on_gpu = at::TensorOptions().device(flat_.values().device());
  block_partials_ = at::empty({device_grid_blocks_}, on_gpu.dtype(at::kDouble));
  if (!trust_segments.empty()) {
    const int64_t count = static_cast<int64_t>(trust_segments.size());
    at::Tensor trust_table = at::empty({count, 2}, at::kInt);
    std::memcpy(trust_table.data_ptr(), trust_segments.data(),
                trust_segments.size() * sizeof(FusedTrustSegment));
    trust_segments_ = trust_table.to(flat_.values().device());
    segment_partials_ = at::empty({device_grid_blocks_, count, 2}, on_gpu.dtype(at::kDouble));
    parameter_squares_ = at::zeros({2, static_cast<int64_t>(flat_.parameters().size())},
                                   on_gpu.dtype(at::kDouble));
    segment_ratios_ = at::ones({count}, on_gpu.dtype(at::kFloat));
  }
}

void ZeroOptimizer::enqueue_device_step(const HostStepInputs* host_inputs) {
  const c10::cuda::CUDAGuard guard(flat_.values().device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  const KernelDtype dtype = fused_dtype(flat_.values());
  at::Tensor& grads = options_.stage == 2 ? reducer_.partition_grads() : flat_.grads();
  // The model's dtype, or fp32 (Note [Gradient precision] in flat_parameters.h).
  const KernelDtype grad_dtype = fused_dtype(grads);
  const auto* segments = reinterpret_cast<const FusedSegment*>(segments_.data_ptr<int64_t>());
  const int num_segments = static_cast<int>(segments_.size(0));
  launch_grad_sum_of_squares(grads.data_ptr(), grad_dtype, segments, num_segments, device_grid_blocks_,
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
  const FusedStepOptions options = fused_step_options(options_, exp_avg_.defined());
  FusedHostInputs host;
  if (host_inputs) host = {host_inputs->lr, host_inputs->loss_scale};
  auto* state = reinterpret_cast<FusedStepState*>(device_state_.data_ptr());
  launch_step_bookkeeping(sum_of_squares_.data_ptr<double>(), sum_of_squares_copies,
                          options, host_inputs ? &host : nullptr, state, loss_scale_.data_ptr<float>(),
                          stream);
  float* master = master_.defined() ? master_.data_ptr<float>() : nullptr;
  const bool* decay_mask = decay_mask_.defined() ? decay_mask_.data_ptr<bool>() : nullptr;
  float* ema = ema_.defined() ? ema_.data_ptr<float>() : nullptr;
  if (options_.optimizer.layer_adaptive()) {
    enqueue_trust_ratios(grads, grad_dtype, dtype, options);
    const float* ratios = segment_ratios_.data_ptr<float>();
    if (options.rule == FusedRule::kLamb)
      launch_lamb_update(flat_.values().data_ptr(), dtype, master, exp_avg_.data_ptr<float>(),
                         exp_avg_sq_.data_ptr<float>(), decay_mask, ema, segments, num_segments,
                         device_grid_blocks_, state, options, ratios, stream);
    else
      launch_sgd_update(grads.data_ptr(), grad_dtype, flat_.values().data_ptr(), dtype, master,
                        exp_avg_.defined() ? exp_avg_.data_ptr<float>() : nullptr, decay_mask, ema,
                        segments, num_segments, device_grid_blocks_, state, options, stream,
                        ratios);
  } else if (options_.optimizer.adam()) {
    launch_adam_update(grads.data_ptr(), grad_dtype, flat_.values().data_ptr(), dtype, master,
                       exp_avg_.data_ptr<float>(), exp_avg_sq_.data_ptr<float>(), decay_mask, ema,
                       segments, num_segments, device_grid_blocks_, state, options, stream);
  } else {
    launch_sgd_update(grads.data_ptr(), grad_dtype, flat_.values().data_ptr(), dtype, master,
                      exp_avg_.defined() ? exp_avg_.data_ptr<float>() : nullptr, decay_mask, ema,
                      segments, num_segments, device_grid_blocks_, state, options, stream);
  }
}

void ZeroOptimizer::enqueue_trust_ratios(const at::Tensor& grads, KernelDtype grad_dtype,
                                         KernelDtype dtype, const FusedStepOptions& options) {
  // Note [Trust ratios]: this rank's sums, the whole parameters' sums (partitions split
  // parameters between ranks), each segment's ratio.
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  const auto* segments = reinterpret_cast<const FusedSegment*>(segments_.data_ptr<int64_t>());
  const auto* trust = reinterpret_cast<const FusedTrustSegment*>(trust_segments_.data_ptr<int32_t>());
  const int num_segments = static_cast<int>(segments_.size(0));
  const int num_parameters = static_cast<int>(parameter_squares_.size(1));
  const auto* state = reinterpret_cast<const FusedStepState*>(device_state_.data_ptr());
  const bool lamb = options.rule == FusedRule::kLamb;
  launch_trust_sums(grads.data_ptr(), grad_dtype, flat_.values().data_ptr(), dtype,
                    master_.defined() ? master_.data_ptr<float>() : nullptr,
                    lamb ? exp_avg_.data_ptr<float>() : nullptr,
                    lamb ? exp_avg_sq_.data_ptr<float>() : nullptr, segments, trust, num_segments,
                    num_parameters, device_grid_blocks_, state, options,
                    segment_partials_.data_ptr<double>(), parameter_squares_.data_ptr<double>(),
                    stream);
  if (partitioned() && comm_.size() > 1) comm_.all_reduce(parameter_squares_).wait();
  launch_trust_ratios(parameter_squares_.data_ptr<double>(), trust, num_segments, num_parameters,
                      state, options, segment_ratios_.data_ptr<float>(), stream);
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

}  // namespace hpc_train

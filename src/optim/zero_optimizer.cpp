#include "hpc_train/optim/zero_optimizer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "hpc_train/error.h"
#include "hpc_train/monitor/metrics.h"
#include "hpc_train/runtime/test_hooks.h"

namespace hpc_train {

namespace {

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

}  // namespace

void ZeroOptimizer::no_gpu(const char* method) {
  throw Error(std::string("ZeroOptimizer::") + method +
              ": the parameters are on the CPU; the device step needs them on a GPU (a build "
              "with CUDA); on the CPU use step()");
}

ZeroOptimizer::ZeroOptimizer(FlatParameters& flat, Reducer& reducer, Communicator& comm,
                             ZeroOptions options)
    : flat_(flat), reducer_(reducer), comm_(comm), options_(options) {
  if (options_.stage < 0 || options_.stage > 2)
    throw ConfigError("--zero-stage " + std::to_string(options_.stage) + ": use 0, 1 or 2");
  if (!(options_.ema_decay >= 0 && options_.ema_decay < 1))
    throw ConfigError("--ema-decay " + std::to_string(options_.ema_decay) +
                      ": must be in [0, 1) (0 = no EMA), e.g. 0.999");
  if (options_.loss_scaling && !options_.check_overflow)
    throw ConfigError("ZeroOptions: fp16 loss scaling needs check_overflow, so that an "
                      "overflowed step is skipped");
  if (on_device()) create_device_buffers();
  else if (options_.loss_scaling) host_scaler_.emplace(*options_.loss_scaling);
  FullOptimizerState initial;
  initial.master = flat_.to_logical(flat_.values()).to(at::kFloat);
  initial.exp_avg = at::zeros_like(initial.master);
  initial.exp_avg_sq = at::zeros_like(initial.master);
  if (options_.ema_decay > 0) initial.ema = initial.master.clone();
  load_full_state(initial);
  reducer_.observe_layout(this);  // the reducer's re-layouts carry the state over
}

ZeroOptimizer::~ZeroOptimizer() { reducer_.stop_observing_layout(this); }

bool ZeroOptimizer::separate_master() const {
  return flat_.values().scalar_type() != at::kFloat;
}

at::Tensor ZeroOptimizer::own_slice(const at::Tensor& flat, const Partition::Slice& slice) {
  return flat.narrow(0, slice.flat_offset, slice.numel);
}

at::Tensor ZeroOptimizer::partition_slice(const at::Tensor& partition,
                                          const Partition::Slice& slice) {
  return partition.narrow(0, slice.partition_offset, slice.numel);
}

at::Tensor ZeroOptimizer::own_slices(const at::Tensor& flat) const {
  std::vector<at::Tensor> slices;
  for (const Partition::Slice& slice : reducer_.partition().slices)
    slices.push_back(own_slice(flat, slice));
  return at::cat(slices);
}

at::Tensor ZeroOptimizer::gradient_partition() {
  if (options_.stage == 0) return flat_.grads().to(at::kFloat);
  if (options_.stage == 2) return reducer_.partition_grads().to(at::kFloat);
  return own_slices(flat_.grads()).to(at::kFloat);
}

at::Tensor ZeroOptimizer::loss_gradient(const at::Tensor& loss, double averaging) {
  if (on_device() && options_.loss_scaling) return (loss_scale_ * averaging).reshape({});
  const double value = (host_scaler_ ? host_scaler_->scale() : 1.0) * averaging;
  const at::Tensor& kept = constant_loss_gradient_;
  if (!kept.defined() || constant_loss_gradient_value_ != value ||
      kept.device() != loss.device() || kept.scalar_type() != loss.scalar_type()) {
    constant_loss_gradient_ = at::full({}, value, loss.options());
    constant_loss_gradient_value_ = value;
  }
  return constant_loss_gradient_;
}

void ZeroOptimizer::step() {
  if (on_device()) {
    step_on_device();
  } else {
    // Note [Schedule step]: the schedule is evaluated at the steps applied so far.
    const LrScheduleParams schedule = options_.lr_schedule.value_or(
        LrScheduleParams{LrScheduleKind::kConstant, WarmupType::kLinear, options_.optimizer.lr});
    host_last_lr_ = lr_at(schedule, steps_);
    host_momentum_ = momentum_at(schedule, steps_, options_.optimizer.adam()
                                                       ? options_.optimizer.beta1
                                                       : options_.optimizer.momentum);
    host_last_outcome_ = step(host_last_lr_, host_scaler_ ? host_scaler_->scale() : 1.0);
    ++host_global_step_;
    if (host_scaler_) host_scaler_->update(host_last_outcome_.overflow);
  }
  flat_.zero_grads();
}

StepReport ZeroOptimizer::report() const {
  if (on_device()) {
    // The device scaler cannot throw where the overflow happens (inside a queued or captured
    // step): the run ends at this read, as the host scaler ends it at once.
    const StepReport report = read_device_report();
    if (report.scaler_failed)
      throw Error(loss_scale_exhausted(options_.loss_scaling->min_scale, report.global_step,
                                       report.skipped_steps));
    return report;
  }
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
  reducer_.all_gather_slices(flat_.values());
  return gather.elapsed_ms();
}

void ZeroOptimizer::set_lr_schedule(const LrScheduleParams& schedule) {
  const int buffers_before = kept_state_buffers();
  options_.lr_schedule = schedule;
  if (kept_state_buffers() > buffers_before)
    throw Error("ZeroOptimizer::set_lr_schedule: the schedule sets the momentum, but the optimizer "
                "was made without ZeroOptions::momentum_from_schedule and keeps no momentum "
                "buffer");
}

at::Tensor ZeroOptimizer::decay_mask_logical() const {
  std::vector<at::Tensor> pieces;
  for (const at::Tensor& parameter : flat_.parameters())
    pieces.push_back(at::full({parameter.numel()}, parameter.dim() >= 2 ? 1.0f : 0.0f, at::kFloat));
  return at::cat(pieces);
}

bool ZeroOptimizer::cycles_momentum() const {
  return options_.momentum_from_schedule ||
         (options_.lr_schedule && options_.lr_schedule->kind == LrScheduleKind::kOneCycle &&
          options_.lr_schedule->cycle_momentum);
}

int ZeroOptimizer::kept_state_buffers() const {
  return state_buffers(options_.optimizer, cycles_momentum());
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

  if (options_.optimizer.layer_adaptive()) {
    layer_adaptive_step(grads, lr);
    outcome.gather_ms = all_gather_parameters();
    return outcome;
  }
  const OptimizerOptions& rule = options_.optimizer;
  const auto update = [&](at::Tensor target, const at::Tensor& g, at::Tensor first,
                          at::Tensor second, const at::Tensor& mask) {
    if (rule.adam()) adam_update(target, g, first, second, steps_, lr, host_momentum_, rule, mask);
    else sgd_update(target, g, first, steps_, lr, host_momentum_, rule, mask);
  };
  // A buffer the rule does not keep stays undefined in its slices too.
  const auto slice_of = [](const at::Tensor& t, const Partition::Slice& slice) {
    return t.defined() ? partition_slice(t, slice) : at::Tensor();
  };
  if (!partitioned()) {
    at::Tensor target = master_.defined() ? master_ : flat_.values();
    update(target, grads, exp_avg_, exp_avg_sq_, decay_mask_);
    move_ema(ema_, target);
    if (master_.defined()) flat_.values().copy_(master_);
    return outcome;
  }
  for (const Partition::Slice& slice : reducer_.partition().slices) {
    at::Tensor target =
        master_.defined() ? partition_slice(master_, slice) : own_slice(flat_.values(), slice);
    update(target, partition_slice(grads, slice), slice_of(exp_avg_, slice),
           slice_of(exp_avg_sq_, slice), slice_of(decay_mask_, slice));
    move_ema(slice_of(ema_, slice), target);
    if (master_.defined()) own_slice(flat_.values(), slice).copy_(target);
  }
  outcome.gather_ms = all_gather_parameters();
  return outcome;
}

void ZeroOptimizer::move_ema(at::Tensor ema, const at::Tensor& weights) const {
  // Note [Weight EMA]: AveragedModel's avg_fn, d x ema + (1 - d) x weights, products rounded
  // apart as there; the first step copies.
  if (!ema.defined()) return;
  if (steps_ == 1) ema.copy_(weights);
  else ema.mul_(options_.ema_decay).add_(weights * (1.0 - options_.ema_decay));
}

std::vector<ZeroOptimizer::ParameterPiece> ZeroOptimizer::parameter_pieces() const {
  const std::vector<BucketLayout::Slot>& slots = flat_.layout().slots;
  std::vector<ParameterPiece> pieces;
  if (!partitioned()) {
    for (size_t i = 0; i < slots.size(); ++i)
      if (slots[i].numel > 0)
        pieces.push_back({static_cast<int>(i), slots[i].offset, slots[i].offset, slots[i].numel});
  } else {
    for (const Partition::Slice& slice : reducer_.partition().slices) {
      const int64_t slice_end = slice.flat_offset + slice.numel;
      std::vector<ParameterPiece> in_slice;
      for (size_t i = 0; i < slots.size(); ++i) {
        const int64_t first = std::max(slots[i].offset, slice.flat_offset);
        const int64_t end = std::min(slots[i].offset + slots[i].numel, slice_end);
        if (first < end)
          in_slice.push_back({static_cast<int>(i),
                              slice.partition_offset + (first - slice.flat_offset), first,
                              end - first});
      }
      std::sort(in_slice.begin(), in_slice.end(),
                [](const ParameterPiece& a, const ParameterPiece& b) {
                  return a.flat_offset < b.flat_offset;
                });
      pieces.insert(pieces.end(), in_slice.begin(), in_slice.end());
    }
  }
  return pieces;
}

bool ZeroOptimizer::decays(int parameter) const {
  return !options_.no_decay_below_2d || flat_.parameters()[parameter].dim() >= 2;
}

bool ZeroOptimizer::adapts(int parameter) const { return flat_.parameters()[parameter].dim() >= 2; }

void ZeroOptimizer::layer_adaptive_step(const at::Tensor& grads, double lr) {
  // Note [Trust ratios]: every piece's direction and sums of squares first; the ratios once
  // the sums are whole; then the updates.
  const OptimizerOptions& rule = options_.optimizer;
  const bool lamb = rule.kind == OptimizerKind::kLamb;
  const LambCorrection correction =
      lamb_correction(rule.lamb_bias_correction, host_momentum_, rule.beta2, steps_);
  const std::vector<ParameterPiece> pieces = parameter_pieces();
  const size_t parameters = flat_.parameters().size();
  // Per parameter: |w|^2, then |u|^2 (LAMB) or |g|^2 (LARS).
  std::vector<double> squares(2 * parameters, 0.0);
  const auto state_of = [](const at::Tensor& t, const ParameterPiece& piece) {
    return t.defined() ? t.narrow(0, piece.state_offset, piece.numel) : at::Tensor();
  };
  const auto weights_of = [&](const ParameterPiece& piece) {
    return master_.defined() ? state_of(master_, piece)
                             : flat_.values().narrow(0, piece.flat_offset, piece.numel);
  };
  const auto sum_of_squares = [](const at::Tensor& t) {
    return t.to(at::kDouble).square().sum().item<double>();
  };
  std::vector<at::Tensor> directions;  // LAMB's u, per piece
  for (const ParameterPiece& piece : pieces) {
    const at::Tensor weights = weights_of(piece);
    const at::Tensor piece_grads = state_of(grads, piece);
    at::Tensor measured = piece_grads;
    if (lamb) {
      measured = lamb_direction(weights, piece_grads, state_of(exp_avg_, piece),
                                state_of(exp_avg_sq_, piece), host_momentum_, correction, rule,
                                decays(piece.parameter));
      directions.push_back(measured);
    }
    squares[piece.parameter] += sum_of_squares(weights);
    squares[parameters + piece.parameter] += sum_of_squares(measured);
  }
  if (partitioned() && comm_.size() > 1) comm_.all_reduce_doubles(squares);
  for (size_t k = 0; k < pieces.size(); ++k) {
    const ParameterPiece& piece = pieces[k];
    const int p = piece.parameter;
    const double weight_norm = std::sqrt(squares[p]);
    const double other_norm = std::sqrt(squares[parameters + p]);
    at::Tensor weights = weights_of(piece);
    if (lamb) {
      const double ratio = lamb_trust_ratio(weight_norm, other_norm, rule.min_trust_ratio,
                                            rule.max_trust_ratio);
      weights.add_(directions[k], -lr * correction.step_scale * ratio);
    } else {
      const double weight_decay = decays(p) ? rule.weight_decay : 0.0;
      const double ratio = adapts(p) ? lars_trust_ratio(weight_norm, other_norm,
                                                        rule.trust_coefficient, weight_decay,
                                                        rule.eps)
                                     : 1.0;
      lars_update(weights, state_of(grads, piece), state_of(exp_avg_, piece), steps_, lr,
                  host_momentum_, rule, weight_decay, ratio);
    }
    move_ema(state_of(ema_, piece), weights);
    if (master_.defined())
      flat_.values().narrow(0, piece.flat_offset, piece.numel).copy_(weights);
  }
}

int64_t ZeroOptimizer::state_bytes() const {
  return bytes_of(master_) + bytes_of(exp_avg_) + bytes_of(exp_avg_sq_) + bytes_of(decay_mask_) +
         bytes_of(ema_);
}

at::Tensor ZeroOptimizer::ema_flat() {
  if (!ema_.defined()) return at::Tensor();
  return partitioned() ? assemble_full(ema_) : ema_.clone();
}

at::Tensor ZeroOptimizer::assemble_full(const at::Tensor& partition) {
  const Partition& own = reducer_.partition();
  at::Tensor full = at::zeros({own.flat_numel}, partition.options());
  for (const Partition::Slice& slice : own.slices)
    own_slice(full, slice).copy_(partition_slice(partition, slice));
  reducer_.all_gather_slices(full);
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
  // A buffer the rule does not keep is zeros in the full state (and so in a checkpoint).
  const auto logical_or_zeros = [&](const at::Tensor& t) {
    return t.defined() ? logical(t) : at::zeros_like(state.master);
  };
  state.exp_avg = logical_or_zeros(exp_avg_);
  state.exp_avg_sq = logical_or_zeros(exp_avg_sq_);
  if (ema_.defined()) state.ema = logical(ema_);
  return state;
}

void ZeroOptimizer::load_full_state(const FullOptimizerState& state) {
  // A checkpoint's state may come from the host; the optimizer's lives with the parameters.
  const at::Device device = flat_.values().device();
  auto local = [&](const at::Tensor& logical) {
    at::Tensor full = flat_.from_logical(logical.to(device, at::kFloat));
    return partitioned() ? own_slices(full) : full;
  };
  steps_ = state.steps;
  const int buffers = kept_state_buffers();
  exp_avg_ = buffers >= 1 ? local(state.exp_avg) : at::Tensor();
  exp_avg_sq_ = buffers >= 2 ? local(state.exp_avg_sq) : at::Tensor();
  // Note [Weight EMA]: a state without one (a checkpoint of a run without --ema-decay) starts
  // it at the weights.
  if (options_.ema_decay > 0)
    ema_ = local(state.ema.defined() ? state.ema : state.master);
  decay_mask_ = options_.no_decay_below_2d ? local(decay_mask_logical()).to(at::kBool) : at::Tensor();
  master_ = separate_master() ? local(state.master) : at::Tensor();
  // The parameters follow the master weights (a no-op right after construction or re-layout).
  flat_.values().copy_(flat_.from_logical(state.master).to(flat_.values().scalar_type()));
  if (on_device()) {
    prepare_device_layout();
    const StepReport now = read_device_report();
    load_device_state(now.global_step, state.steps, now.scaler);
  }
}

void ZeroOptimizer::before_relayout() { state_across_relayout_ = gather_full_state(); }

void ZeroOptimizer::after_relayout() {
  load_full_state(state_across_relayout_);  // re-partitions for the new layout
  state_across_relayout_ = FullOptimizerState{};
}

// Note [Test hooks]: the steps underneath the policy, for the tests.
StepOutcome TestHooks::step(ZeroOptimizer& optimizer, double lr, double loss_scale) {
  return optimizer.step(lr, loss_scale);
}

void TestHooks::step_on_device(ZeroOptimizer& optimizer) { optimizer.step_on_device(); }

StepReport TestHooks::read_device_report(const ZeroOptimizer& optimizer) {
  return optimizer.read_device_report();
}

void TestHooks::load_device_state(ZeroOptimizer& optimizer, int64_t global_step,
                                  int64_t adam_steps, const LossScalerState& scaler) {
  optimizer.load_device_state(global_step, adam_steps, scaler);
}

const at::Tensor& TestHooks::loss_scale_tensor(const ZeroOptimizer& optimizer) {
  return optimizer.loss_scale_;
}

}  // namespace hpc_train

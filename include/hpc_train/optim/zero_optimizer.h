// The ZeRO optimizer: Adam/AdamW or SGD (optimizer.h) on this rank's partition of fp32 master
// weights and optimizer state, after the reducer has reduced the gradients.
//
//   stage 0  every rank holds the whole optimizer state and updates every parameter
//   stage 1  each rank updates only its partition (its slice of every bucket, Note [Bucket
//            layout]), read from its own slices of the flat gradients (reduce-scattered there in
//            place), then the buckets are all-gathered
//   stage 2  as stage 1, but the reducer keeps only this rank's partition of the reduced
//            gradients (Note [Partitioned gradients] in reducer.h)
//
// One step: unscale (fp16) -> overflow check agreed by all ranks (fp16; an overflow skips the
// step everywhere) -> clip by the global norm -> the update on the fp32 master partition ->
// cast to the model dtype -> all-gather. In fp32 the parameters themselves are the master
// weights (no copy); in fp16/bf16 a separate fp32 copy of the partition is kept. The gradients
// it reads are of the model's dtype, or fp32 (Note [Gradient precision] in flat_parameters.h):
// the overflow check and the norm then see the fp32 sum, which may exceed fp16's range without
// being an overflow.
//
// Two ways to run a step when the parameters are on a GPU (GPU build), both through the fused
// kernels of fused_optimizer.h:
//   step(lr, loss_scale)  the host gives the learning rate and the loss scale (a LossScaler on
//                         the host decides) and gets a StepOutcome back: one host sync per step.
//   step_on_device()      nothing crosses to the host: the device evaluates the learning-rate
//                         schedule (ZeroOptions::lr_schedule), the fp16 loss scaler runs on the
//                         device (ZeroOptions::loss_scaling; loss_gradient() reads its scale
//                         there), and the counters stay there until read_device_report.
//                         With the NCCL backend the host never waits, so a whole training step
//                         can be captured in a CUDA graph and replayed (the buffers it uses are
//                         allocated at construction and on every (re)layout, never per step).
// On the CPU, step(lr, loss_scale) runs ATen operations (adam_update), and the device methods
// throw.
//
// The step policy lives here on both devices, as DeepSpeed's ZeRO optimizer keeps its loss
// scaler: the fp16 loss scaler (a LossScaler on the host, the device scaler on a GPU), the
// learning-rate schedule (Note [Schedule step]) and zeroing the gradients after each step. The
// trainer starts backward from loss_gradient(), calls step(), and reads report(). The steps
// underneath are private: the policy calls them, and the tests reach them through TestHooks
// (Note [Test hooks] in test_hooks.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "hpc_train/comm/comm.h"
#include "hpc_train/comm/flat_parameters.h"
#include "hpc_train/optim/loss_scaler.h"
#include "hpc_train/optim/lr_schedule.h"
#include "hpc_train/optim/optimizer.h"
#include "hpc_train/comm/reducer.h"
#include "hpc_train/runtime/kernel_dtype.h"

namespace hpc_train {

struct FusedStepOptions;  // fused_optimizer.h, the device path's

struct ZeroOptions {
  int stage = 0;
  OptimizerOptions optimizer;
  double clip_grad = 0.0;       // max global norm; 0 = off
  bool check_overflow = false;  // fp16: look for inf/nan and skip the step on every rank
  // step() and step_on_device(): the learning-rate schedule, evaluated at the steps applied so
  // far (Note [Schedule step] in lr_schedule.h). Absent: optimizer.lr throughout.
  std::optional<LrScheduleParams> lr_schedule;
  // A schedule given later (set_lr_schedule) will set the momentum (Note [Cycled momentum] in
  // lr_schedule.h): SGD keeps its momentum buffer from the start, so that a checkpoint's buffer
  // has a place to go before the run's schedule is known.
  bool momentum_from_schedule = false;
  // --no-decay-bias-bn: no weight decay on parameters of one dimension or none (biases,
  // normalisation weights), as torch parameter groups with weight_decay 0 give.
  bool no_decay_below_2d = false;
  // --ema-decay: > 0 keeps an EMA of the fp32 weights (Note [Weight EMA]); 0: none.
  double ema_decay = 0.0;
  // step() and step_on_device(): fp16 loss scaling with LossScaler's rules, on the host or kept
  // on the GPU (needs check_overflow). Absent: the loss scale is 1.
  std::optional<LossScalerOptions> loss_scaling;
};

struct StepOutcome {
  bool overflow = false;  // some rank saw inf/nan: nothing was updated
  double grad_norm = 0.0; // global norm of the unscaled gradients (before clipping)
  double gather_ms = 0.0; // time in the all-gather of parameters (stages 1, 2)
};

// What the steps have counted and learnt (report, read_device_report): for log lines and
// checkpoints.
struct StepReport {
  int64_t global_step = 0;     // optimizer steps taken or skipped
  int64_t adam_steps = 0;      // steps applied (FullOptimizerState::steps)
  int64_t skipped_steps = 0;   // global_step - adam_steps
  double loss_scale = 1.0;     // what the next backward's loss is multiplied by
  double last_grad_norm = 0.0; // the latest step's unscaled global norm before clipping; 0 if skipped
  double last_lr = 0.0;        // the latest step's learning rate
  bool last_overflow = false;  // the latest step was skipped
  LossScalerState scaler;      // the loss scaler, as LossScaler::state() (checkpoints)
  bool scaler_failed = false;  // an overflow at the minimum loss scale: the run cannot go on
};

// The optimizer state in the logical layout (flat_parameters.h), independent of world size and
// buckets: what a checkpoint stores and what survives a re-layout. Every array is whole; a
// buffer the update rule does not keep (SGD's second, its first without momentum) is zeros.
struct FullOptimizerState {
  at::Tensor master;      // fp32
  at::Tensor exp_avg;     // Adam's first moment, or SGD's momentum buffer
  at::Tensor exp_avg_sq;  // Adam's second moment
  at::Tensor ema;         // the weights' EMA (Note [Weight EMA]); undefined: the run keeps none
  int64_t steps = 0;
};

// Note [Weight EMA]
// --ema-decay d keeps an exponential moving average of the fp32 weights, as
// torch.optim.swa_utils.AveragedModel with avg_fn d x ema + (1 - d) x weights, updated after
// every applied step (the first one copies the weights; an fp16 step skipped for an overflow
// changes nothing, the EMA included). It is optimizer state: partitioned like the moments (each
// rank averages its own slices), carried through re-layouts, checkpointed; ema_flat() assembles
// it for evaluation and export. Buffers (BatchNorm statistics) are not averaged: the EMA is
// evaluated with the model's own, as AveragedModel's default (use_buffers=False) gives.

// The optimizer sees the reducer's partition, never its layout: the reducer rebuilds the buckets
// after the first step, and tells the optimizer around it (LayoutObserver), which carries its state
// over through the logical layout.
class ZeroOptimizer : private LayoutObserver {
 public:
  // Registers with `reducer` as its LayoutObserver; `flat`, `reducer` and `comm` must outlive it.
  ZeroOptimizer(FlatParameters& flat, Reducer& reducer, Communicator& comm, ZeroOptions options);
  ~ZeroOptimizer() override;
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  // --- The step policy (see the top of this file).
  // The gradient to start `loss`'s backward from: the current loss scale x `averaging` (Note
  // [Gradient averaging] in training_step.cpp), as if backward ran on loss x scale x averaging,
  // a 0-dim tensor like `loss`. Starting from it spares that product, the ones autograd would
  // start from and the product's backward: three launches of every step. On a GPU with fp16 it is
  // the device scaler's scale, read when the step runs (no host sync, capturable); otherwise a
  // constant, made once (outside a capture) and kept while it stays the same.
  at::Tensor loss_gradient(const at::Tensor& loss, double averaging);
  // One optimizer step with the owned schedule and scaler, then the gradients are zeroed. On a
  // GPU it is queued (step_on_device) and may be captured in a CUDA graph; on the CPU the host
  // scaler learns of an overflow at once (and throws Error at its minimum scale, as
  // LossScaler::update). Collective.
  void step();
  // The counters, the last step and the scaler. GPU: waits for the current stream, and throws
  // Error (loss_scale_exhausted) when the device scaler overflowed at its minimum scale.
  StepReport report() const;
  // For a resume, after load_full_state: the counters and the scaler continue from these.
  void resume(int64_t global_step, int64_t adam_steps, const LossScalerState& scaler);

  // Replaces ZeroOptions::lr_schedule (e.g. once the run's length is known), for both paths.
  // Before a step is captured: a captured step keeps the schedule it was captured with. Throws
  // Error for a schedule that sets the momentum of an SGD without its buffer (see
  // ZeroOptions::momentum_from_schedule).
  void set_lr_schedule(const LrScheduleParams& schedule);

  // Steps applied. On a GPU it reads the device (a sync).
  int64_t steps_taken() const;
  // Bytes of optimizer state on this rank: the rule's buffers, fp32 master weights when separate,
  // and the weight decay's mask where it has one.
  int64_t state_bytes() const;

  FullOptimizerState gather_full_state();  // collective
  // The weights' EMA in the flat layout, fp32, whole on every rank; undefined without one.
  // Collective.
  at::Tensor ema_flat();
  void load_full_state(const FullOptimizerState& state);

 private:
  friend struct TestHooks;  // the steps underneath (Note [Test hooks])

  // --- The steps underneath the policy.
  // Gradients in the flat buffer (stages 0, 1) or the reducer's partition (stage 2) are the sum
  // over ranks of each rank's gradient of loss * loss_scale / (world size * grad_accum)
  // (Note [Gradient averaging]). Leaves the gradients as they are. Collective.
  StepOutcome step(double lr, double loss_scale);
  // The same step with no host sync and no host input (see the top of this file); the parameters
  // must be on a GPU. Queued on the current CUDA stream; the all-reduce of the squared norm
  // (partitioned, or fp16 at stage 0) and the all-gathers go through the communicator, which
  // must be NCCL for the host never to wait. Leaves the gradients as they are. Collective.
  void step_on_device();
  // GPU: one small copy to the host (waits for the current stream).
  StepReport read_device_report() const;
  // GPU, for a resume: the counters and the loss scaler continue from these. After
  // load_full_state (which sets adam_steps from FullOptimizerState::steps too).
  void load_device_state(int64_t global_step, int64_t adam_steps, const LossScalerState& scaler);

  struct HostStepInputs {  // step()'s arguments, for the device path
    double lr;
    double loss_scale;
  };

  bool partitioned() const { return options_.stage >= 1; }
  // The schedule sets the momentum (Note [Cycled momentum] in lr_schedule.h).
  bool cycles_momentum() const;
  // state_buffers(), for this run's rule and schedule.
  int kept_state_buffers() const;
  // fp32 in the logical layout: 1 where weight decay applies, 0 on parameters below 2-D.
  at::Tensor decay_mask_logical() const;
  bool on_device() const { return flat_.values().is_cuda(); }
  bool separate_master() const;
  at::Tensor gradient_partition();  // fp32 copy or view of this rank's reduced gradients
  // A slice of this rank's partition in a flat-layout tensor, and in a partition tensor.
  static at::Tensor own_slice(const at::Tensor& flat, const Partition::Slice& slice);
  static at::Tensor partition_slice(const at::Tensor& partition, const Partition::Slice& slice);
  // A flat-layout tensor's slices of this rank's partition, as a partition tensor (a copy).
  at::Tensor own_slices(const at::Tensor& flat) const;
  at::Tensor assemble_full(const at::Tensor& partition);  // collective, flat layout
  // Note [Trust ratios] in optimizer.h: this rank's elements of each parameter, one run per
  // parameter (a parameter lies in one bucket, and a rank holds one slice of a bucket), in
  // partition order. Stage 0: every parameter whole, at its place in the flat buffers.
  struct ParameterPiece {
    int parameter = 0;             // model index
    int64_t state_offset = 0;      // in the state (and in the gradients step() reads)
    int64_t flat_offset = 0;       // in the flat buffers
    int64_t numel = 0;
  };
  std::vector<ParameterPiece> parameter_pieces() const;
  bool decays(int parameter) const;  // weight decay applies to it (--no-decay-bias-bn)
  // LARS scales it by a trust ratio: 2-D or more (Note [Trust ratios]).
  bool adapts(int parameter) const;
  // step() on the CPU, LAMB and LARS: `grads` unscaled and clipped, laid out as the state.
  void layer_adaptive_step(const at::Tensor& grads, double lr);
  // Note [Weight EMA]: moves `ema` towards `weights` (the same elements), after step steps_.
  void move_ema(at::Tensor ema, const at::Tensor& weights) const;
  // LayoutObserver: the state leaves the old partition through the logical layout (gathered)
  // and enters the new one.
  void before_relayout() override;
  void after_relayout() override;
  // Stages 1, 2: every rank's updated slices to every rank. Returns the milliseconds it took.
  double all_gather_parameters();
  // The device path (zero_optimizer_cuda.cpp; a CPU build's, zero_optimizer_cpu.cpp, throw).
  // Buffers that live as long as the optimizer; the segment table and reduction scratch for the
  // current layout; one step's kernels and reductions, with the host's learning rate and loss
  // scale or (nullptr) the device's.
  void create_device_buffers();
  void prepare_device_layout();
  void enqueue_device_step(const HostStepInputs* host_inputs);
  // LAMB and LARS: the trust-ratio kernels and the all-reduce of their sums, after the
  // bookkeeping and before the update (zero_optimizer_cuda.cpp).
  void enqueue_trust_ratios(const at::Tensor& grads, KernelDtype grad_dtype, KernelDtype dtype,
                            const FusedStepOptions& options);
  // Throws Error: the device path's `method` was called, but the parameters are on the CPU.
  [[noreturn]] static void no_gpu(const char* method);

  FlatParameters& flat_;
  Reducer& reducer_;
  Communicator& comm_;
  ZeroOptions options_;
  FullOptimizerState state_across_relayout_;  // between before_ and after_relayout
  int64_t steps_ = 0;  // steps applied, on the CPU (on a GPU the device state counts them)
  // step() on the CPU: steps taken or skipped, the last one's outcome and lr, the fp16 scaler.
  int64_t host_global_step_ = 0;
  StepOutcome host_last_outcome_;
  double host_last_lr_ = 0.0;
  double host_momentum_ = 0.0;  // the latest step's: SGD's momentum, or Adam's beta1
  std::optional<LossScaler> host_scaler_;
  at::Tensor master_;  // fp32; partition (stages 1, 2) or whole; undefined when params are fp32 master
  // The update rule's state (state_buffers in optimizer.h): both for Adam, exp_avg alone for SGD
  // with momentum; undefined where the rule keeps none.
  at::Tensor exp_avg_;
  at::Tensor exp_avg_sq_;
  // bool, laid out as the state: the elements weight decay applies to; undefined: every one.
  at::Tensor decay_mask_;
  at::Tensor ema_;  // fp32, laid out as the state (Note [Weight EMA]); undefined: none
  // The device path's buffers, on the parameters' GPU (undefined on the CPU).
  at::Tensor device_state_;    // the bytes of one FusedStepState (fused_optimizer.h)
  // fp32 [1]: the device scaler's current scale, updated by every step_on_device; the loss is
  // multiplied by it (loss_gradient) with no host sync.
  at::Tensor loss_scale_;
  at::Tensor constant_loss_gradient_;  // loss_gradient()'s constant, and its value
  double constant_loss_gradient_value_ = 0.0;
  at::Tensor sum_of_squares_;  // fp64 [1]: the squared global norm of the (scaled) gradients
  at::Tensor block_partials_;  // fp64 [device_grid_blocks_]: the reduction's per-block sums
  at::Tensor segments_;        // int64 [segments, 4]: FusedSegment, this rank's partition
  // LAMB and LARS on the device (Note [Trust ratios]), per layout: the segments are the
  // parameter pieces, and these say whose each is and hold the norms' sums.
  at::Tensor trust_segments_;     // int32 [segments, 2]: FusedTrustSegment
  at::Tensor segment_partials_;   // fp64 [blocks, segments, 2]: per-block sums of squares
  at::Tensor parameter_squares_;  // fp64 [2, parameters]: |w|^2, then |u|^2 or |g|^2
  at::Tensor segment_ratios_;     // fp32 [segments]: each segment's parameter's trust ratio
  int device_grid_blocks_ = 0;
};

}  // namespace hpc_train

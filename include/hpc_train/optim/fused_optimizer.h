// The fused optimizer step on the GPU: kernels of ours (src/optim/fused_optimizer.cu) that do a
// whole ZeRO optimizer step on this rank's partition without the host reading any value back and
// without any per-step input from the host, so that a training step can be captured in a CUDA
// graph and replayed. In stream order:
//
//   launch_grad_sum_of_squares  sum over the partition's segments of grad^2, into one fp64 value
//                               (the caller all-reduces it across ranks when it must)
//   launch_step_bookkeeping     one thread: overflow check, global norm, clip coefficient, the
//                               learning rate from the schedule (lr_schedule.h), Adam's step count and bias
//                               corrections, the loss-scale update (Note [Device loss scaler])
//   launch_adam_update          unscale and clip (one multiplier), Adam/AdamW on the fp32
//                               master weights and moments, the cast to the model dtype into the
//                               flat parameter buffer (the all-gather buffer); nothing on overflow
//   launch_sgd_update           the same with SGD (momentum, dampening, Nesterov) instead
//   LAMB and LARS (Note [Trust ratios] in optimizer.h) put two kernels and a reduction between
//   the bookkeeping and the update: launch_trust_sums (LAMB's moments move there too), the
//   caller's all-reduce of the per-parameter sums, launch_trust_ratios; then launch_lamb_update,
//   or launch_sgd_update with the ratios (LARS)
//
// The arithmetic is adam_update's and sgd_update's (optimizer.h) and ZeroOptimizer::step's
// (zero_optimizer.h),
// operation for operation; the loss scaler is LossScaler's (loss_scaler.h), rule for rule.
// Torch-free: raw device pointers and element counts. Needs the CUDA runtime's headers, so only
// GPU-build code includes it (HPC_TRAIN_WITH_CUDA).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#include "hpc_train/optim/lr_schedule.h"
#include "hpc_train/optim/trust_ratio.h"
#include "hpc_train/runtime/kernel_dtype.h"

namespace hpc_train {


// One contiguous run of this rank's partition, in elements. The partition is one segment in
// stage 0 (the whole flat buffers) and one per bucket in stages 1 and 2 (the rank's slice of each
// bucket, Note [Bucket layout]; slices that follow each other in every buffer are one segment);
// the table lives on the device, built once per layout.
struct FusedSegment {
  int64_t numel = 0;
  int64_t grad_offset = 0;    // in the gradient buffer (flat grads, or the stage-2 partition)
  int64_t master_offset = 0;  // in the moments, and in the master weights when they are separate
  int64_t param_offset = 0;   // in the flat parameters (the master weights when the model is fp32)
};
static_assert(sizeof(FusedSegment) == 4 * sizeof(int64_t), "uploaded as an int64 tensor [n, 4]");

enum class FusedLossScaling : int32_t { kNone, kFixed, kDynamic };
enum class FusedRule : int32_t { kAdam, kSgd, kLamb, kLars };

// Note [Trust ratios]: LAMB's and LARS's segments are the pieces of parameters (one parameter
// each; padding and alignment gaps are left out, they stay zero); this says whose each is.
struct FusedTrustSegment {
  int32_t parameter = 0;  // the model's index
  int32_t flags = 0;      // kTrustDecays | kTrustAdapts
};
static_assert(sizeof(FusedTrustSegment) == 2 * sizeof(int32_t), "uploaded as an int32 tensor [n, 2]");
inline constexpr int32_t kTrustDecays = 1;  // weight decay applies to the parameter
inline constexpr int32_t kTrustAdapts = 2;  // LARS: the parameter adapts (2-D or more)

// What stays the same for a whole run.
struct FusedStepOptions {
  FusedRule rule = FusedRule::kAdam;
  double beta1 = 0.9;                  // Adam; a one-cycle schedule may cycle it
  double momentum = 0.0;               // SGD; likewise
  double dampening = 0.0;              // SGD
  bool nesterov = false;               // SGD
  bool momentum_buffer = false;        // SGD keeps a momentum buffer
  double ema_decay = 0.0;              // > 0: the update also moves the EMA of the weights
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled_weight_decay = true;  // AdamW; false: Adam or SGD with an L2 penalty
  double trust_coefficient = 1e-3;     // LARS
  double min_trust_ratio = 0.0;        // LAMB
  double max_trust_ratio = 0.0;        // LAMB; 0 = no upper bound
  LambBiasCorrection lamb_bias_correction = LambBiasCorrection::kMoments;
  double clip_grad = 0.0;              // max global norm; 0 = off
  bool check_overflow = false;         // fp16: an inf/nan sum of squares skips the step
  FusedLossScaling loss_scaling = FusedLossScaling::kNone;
  int32_t scale_window = 1000;         // kDynamic: LossScalerOptions' meaning
  int32_t hysteresis = 2;
  double min_scale = 1.0;
  LrScheduleParams lr_schedule;        // evaluated at the applied steps (Note [Schedule step])
};

// Note [Device loss scaler]
// The state below carries LossScalerState's fields and LossScaler::update's rules: a fixed scale
// counts steps and skipped steps; a dynamic one halves after the hysteresis is used up, doubles
// when (scaler_steps - last_overflow_step) % window == 0 (Note [Loss scale window]). Where the
// host scaler throws (an overflow at the minimum scale), the device sets scaler_failed, leaves the
// scaler as it was, and the step is skipped as any overflowed step; the host finds the flag the
// next time it reads the state and ends the run.
//
// All of it lives in device memory; the bookkeeping kernel reads and writes it once per step.
struct FusedStepState {
  int64_t global_step = 0;   // optimizer steps taken or skipped
  int64_t adam_steps = 0;    // steps applied: Adam's t, and the schedule's step (before the update)
  double loss_scale = 1.0;   // what the next backward's loss is multiplied by
  int64_t scaler_steps = 0;
  int64_t last_overflow_step = -1;
  int64_t scaler_skipped_steps = 0;
  // The latest step, written by the bookkeeping kernel (the update kernel reads the rest).
  double grad_norm = 0.0;    // unscaled, before clipping; 0 when the step overflowed
  double lr = 0.0;
  int32_t hysteresis_left = 0;
  int32_t scaler_failed = 0;
  int32_t found_inf = 0;     // the step overflowed: the update kernel does nothing
  float grad_multiplier = 1.0f;        // 1 / loss scale x clip coefficient
  float decay_factor = 1.0f;           // 1 - lr x weight_decay (AdamW)
  float step_size = 0.0f;              // Adam: -lr / bias_correction1; SGD: -lr
  float sqrt_bias_correction2 = 1.0f;
  // The momentum of the step (momentum_at in lr_schedule.h): Adam's beta1 or SGD's momentum.
  float momentum = 0.0f;
  float one_minus_momentum = 1.0f;     // Adam: 1 - beta1
  // SGD: buffer = buffer x buffer_keep + gradient_share x gradient; on the first step 0 and 1,
  // so that the buffer becomes the gradient (torch.optim.SGD clones it), then momentum and
  // 1 - dampening.
  float buffer_keep = 0.0f;
  float gradient_share = 1.0f;
  // The EMA of the weights (Note [Weight EMA] in zero_optimizer.h): ema = ema x ema_keep +
  // ema_share x weight; on the first step 0 and 1 (the EMA becomes the weights), then the decay
  // and 1 - decay.
  float ema_keep = 0.0f;
  float ema_share = 1.0f;
  // LAMB (trust_ratio.h's LambCorrection): the direction's scales, and -lr x step_scale, which
  // the ratio multiplies.
  float lamb_moment_scale = 1.0f;
  float lamb_root_scale = 1.0f;
  double lamb_step = 0.0;
};
static_assert(std::is_standard_layout<FusedStepState>::value, "copied as bytes");

// The ZeroOptimizer::step path: the host gives this step's learning rate and loss scale, and the
// device loss scaler is left alone (a LossScaler on the host decides).
struct FusedHostInputs {
  double lr = 0.0;
  double loss_scale = 1.0;
};

// Blocks for a partition of `partition_numel` elements on the current device: enough to fill
// every SM, no more than there is work for. Fixed per layout (the reduction's partials depend on
// it, and so its summation order: the norm is bitwise reproducible).
int fused_grid_blocks(int64_t partition_numel);

// sum_of_squares[0] = sum of grad^2 over the segments, accumulated in fp64 (see the .cu).
// block_partials holds grid_blocks doubles.
void launch_grad_sum_of_squares(const void* grads, KernelDtype dtype, const FusedSegment* segments,
                                int num_segments, int grid_blocks, double* block_partials,
                                double* sum_of_squares, cudaStream_t stream);

// One step's bookkeeping from the (all-reduced) sum of squares. `sum_of_squares_copies`: how many
// ranks' identical sums the all-reduce added (stage 0 reduces only to agree on overflow), divided
// out; 1 otherwise. host_inputs: nullptr on the device path (the learning rate is then
// options.lr_schedule's at the applied steps). Also writes the new loss scale to loss_scale_out[0].
void launch_step_bookkeeping(const double* sum_of_squares, double sum_of_squares_copies,
                             const FusedStepOptions& options, const FusedHostInputs* host_inputs,
                             FusedStepState* state, float* loss_scale_out, cudaStream_t stream);

// The update of every segment, unless the state says the step overflowed. `master` is nullptr
// when the model is fp32 (the parameters are the master weights, updated in place). The
// gradients are of the parameters' dtype, or of `grad_dtype` where given: fp32 gradients of a
// 16-bit model (Note [Gradient precision] in flat_parameters.h). `decay_mask` (laid out as the
// moments; nullptr: every element): where weight decay applies (--no-decay-bias-bn). `ema`
// (laid out as the moments; nullptr: none) is moved towards the updated weights.
void launch_adam_update(const void* grads, void* params, KernelDtype dtype, float* master,
                        float* exp_avg, float* exp_avg_sq, const FusedSegment* segments,
                        int num_segments, int grid_blocks, const FusedStepState* state,
                        const FusedStepOptions& options, cudaStream_t stream);
void launch_adam_update(const void* grads, KernelDtype grad_dtype, void* params, KernelDtype dtype,
                        float* master, float* exp_avg, float* exp_avg_sq, const bool* decay_mask,
                        float* ema, const FusedSegment* segments, int num_segments,
                        int grid_blocks, const FusedStepState* state,
                        const FusedStepOptions& options, cudaStream_t stream);
// SGD's update, as launch_adam_update's; `momentum_buffer` is nullptr when
// options.momentum_buffer is false.
// `segment_ratios` (LARS; nullptr: SGD, ratio 1): each segment's trust ratio.
void launch_sgd_update(const void* grads, KernelDtype grad_dtype, void* params, KernelDtype dtype,
                       float* master, float* momentum_buffer, const bool* decay_mask,
                       float* ema, const FusedSegment* segments, int num_segments,
                       int grid_blocks, const FusedStepState* state,
                       const FusedStepOptions& options, cudaStream_t stream,
                       const float* segment_ratios = nullptr);

// Note [Trust ratios], on this rank's segments (FusedTrustSegment, one per segment):
// per parameter, the sum of squares of the weights into parameter_squares[p] and of LAMB's
// direction (its moments move here) or LARS's unscaled, clipped gradient into
// parameter_squares[num_parameters + p]; parameters with no segment here get 0, so that an
// all-reduce of the 2 x num_parameters doubles across ranks gives the whole parameters' sums.
// segment_partials holds grid_blocks x num_segments x 2 doubles. In fp64, in a fixed order
// (Note [Fused sum of squares in fp64]). Nothing when the step overflowed.
void launch_trust_sums(const void* grads, KernelDtype grad_dtype, const void* params,
                       KernelDtype dtype, const float* master, float* exp_avg, float* exp_avg_sq,
                       const FusedSegment* segments, const FusedTrustSegment* trust_segments,
                       int num_segments, int num_parameters, int grid_blocks,
                       const FusedStepState* state, const FusedStepOptions& options,
                       double* segment_partials, double* parameter_squares, cudaStream_t stream);
// From the whole parameters' sums: LARS's ratio of each segment, or LAMB's ratio times its step
// (-lr x step_scale), into segment_ratios.
void launch_trust_ratios(const double* parameter_squares, const FusedTrustSegment* trust_segments,
                         int num_segments, int num_parameters, const FusedStepState* state,
                         const FusedStepOptions& options, float* segment_ratios,
                         cudaStream_t stream);
// LAMB's update from the moments launch_trust_sums moved: w += segment_ratios[s] x u.
void launch_lamb_update(void* params, KernelDtype dtype, float* master, float* exp_avg,
                        float* exp_avg_sq, const bool* decay_mask, float* ema,
                        const FusedSegment* segments, int num_segments, int grid_blocks,
                        const FusedStepState* state, const FusedStepOptions& options,
                        const float* segment_ratios, cudaStream_t stream);

}  // namespace hpc_train

// The fused optimizer kernels (fused_optimizer.h).
//
// Work layout: every kernel but the one-thread bookkeeping runs a fixed grid (fused_grid_blocks)
// of kThreads threads that walks the segments one after another, each with a grid-stride loop,
// so thread t takes the same elements of a segment in every step. Within a segment, elements
// move kVectorElements at a time (16-byte fp32 and 8-byte fp16/bf16 accesses) when all of the
// segment's arrays share one misalignment, after a scalar head that aligns them; otherwise (a
// partition slice can start at any element) the segment goes element by element.
//
// Note [Fused sum of squares in fp64]
// Squares are accumulated in fp64: the square of any fp32/fp16/bf16 value is exact in fp64 and
// cannot overflow (in fp32, a finite bf16 or fp32 gradient above ~1.8e19 would square to inf and
// fake an overflow), and the sum over 1e8 elements keeps ~1e-9 relative precision instead of
// fp32's ~1e-4, so the norm, and so the clip coefficient, does not depend on the stage or the
// world size. An inf or nan gradient makes its square inf or nan, and the sum with it. The
// kernel is memory-bound: the fp64 adds cost nothing measurable on Hopper. Blocks write partial
// sums and one block adds them in a fixed order: no atomics, so the same inputs give the same bits.
#include "hpc_train/optim/fused_optimizer.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "hpc_train/runtime/cuda_check.h"
#include "hpc_train/runtime/cuda_float.cuh"
#include "hpc_train/error.h"

namespace hpc_train {
namespace {

constexpr int kThreads = 256;        // per block
constexpr int kWarpSize = 32;
constexpr int kVectorElements = 4;   // per vector access
constexpr int kBlocksPerSm = 8;      // 8 x 256 = 2048 resident threads, an SM's maximum

template <typename T>
struct alignas(sizeof(T) * kVectorElements) Vector {
  T element[kVectorElements];
};

// How many elements `p` lies past a vector boundary.
template <typename T>
__device__ __forceinline__ int64_t misalignment(const T* p) {
  return static_cast<int64_t>((reinterpret_cast<uintptr_t>(p) / sizeof(T)) % kVectorElements);
}

// Elements before the first vector boundary, given the misalignment.
__device__ __forceinline__ int64_t head_elements(int64_t numel, int64_t misaligned_by) {
  return min(numel, (kVectorElements - misaligned_by) % kVectorElements);
}

__device__ __forceinline__ int64_t first_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t thread_count() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// The block's sums of N values per thread, valid in thread 0, each in one fixed order (a shuffle
// tree per warp, then one over the warps); every thread of the block must call it. It ends with
// the block in step, so that it can be called again at once.
template <int N>
__device__ void block_sums(double (&values)[N]) {
  __shared__ double warp_sums[N][kThreads / kWarpSize];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int n = 0; n < N; ++n) {
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
      values[n] += __shfl_down_sync(0xffffffffu, values[n], offset);
    if (lane == 0) warp_sums[n][warp] = values[n];
  }
  __syncthreads();
#pragma unroll
  for (int n = 0; n < N; ++n) {
    values[n] = 0.0;
    if (warp == 0) {
      if (lane < kThreads / kWarpSize) values[n] = warp_sums[n][lane];
      for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
        values[n] += __shfl_down_sync(0xffffffffu, values[n], offset);
    }
  }
  __syncthreads();
}

__device__ double block_sum(double value) {
  double values[1] = {value};
  block_sums(values);
  return values[0];
}

template <typename T>
__device__ __forceinline__ double squared(T x) {
  const double d = to_float(x);
  return d * d;
}

// Note [Fused sum of squares in fp64]
template <typename T>
__global__ void __launch_bounds__(kThreads)
    grad_sum_of_squares_kernel(const T* __restrict__ grads,
                               const FusedSegment* __restrict__ segments, int num_segments,
                               double* __restrict__ block_partials) {
  const int64_t thread = first_thread();
  const int64_t threads = thread_count();
  double sum = 0.0;
  for (int s = 0; s < num_segments; ++s) {
    const FusedSegment segment = segments[s];
    const T* g = grads + segment.grad_offset;
    const int64_t head = head_elements(segment.numel, misalignment(g));
    const int64_t vectors = (segment.numel - head) / kVectorElements;
    const int64_t tail = head + vectors * kVectorElements;
    if (thread < head) sum += squared(g[thread]);
    const Vector<T>* body = reinterpret_cast<const Vector<T>*>(g + head);
    for (int64_t i = thread; i < vectors; i += threads) {
      const Vector<T> v = body[i];
#pragma unroll
      for (int k = 0; k < kVectorElements; ++k) sum += squared(v.element[k]);
    }
    if (tail + thread < segment.numel) sum += squared(g[tail + thread]);
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) block_partials[blockIdx.x] = sum;
}

__global__ void __launch_bounds__(kThreads)
    finish_sum_of_squares_kernel(const double* __restrict__ block_partials, int num_partials,
                                 double* __restrict__ sum_of_squares) {
  double sum = 0.0;
  for (int i = threadIdx.x; i < num_partials; i += kThreads) sum += block_partials[i];
  sum = block_sum(sum);
  if (threadIdx.x == 0) *sum_of_squares = sum;
}

// LossScaler::update, on the device (Note [Device loss scaler]).
__device__ void update_loss_scale(FusedStepState& state, bool overflow,
                                  const FusedStepOptions& options) {
  if (options.loss_scaling == FusedLossScaling::kNone) return;
  if (options.loss_scaling == FusedLossScaling::kFixed) {
    ++state.scaler_steps;
    if (overflow) ++state.scaler_skipped_steps;
    return;
  }
  if (overflow) {
    if (state.hysteresis_left <= 1) {
      if (state.loss_scale == options.min_scale) {
        state.scaler_failed = 1;  // where LossScaler::update throws, before changing anything
        return;
      }
      state.loss_scale = fmax(state.loss_scale / 2, options.min_scale);
    } else {
      --state.hysteresis_left;
    }
    state.last_overflow_step = state.scaler_steps;
    ++state.scaler_skipped_steps;
  } else if ((state.scaler_steps - state.last_overflow_step) % options.scale_window == 0) {
    // Note [Loss scale window]
    state.hysteresis_left = options.hysteresis;
    state.loss_scale *= 2;
  }
  ++state.scaler_steps;
}

// Adam's moments and beta1 (Adam, AdamW, LAMB), or SGD's momentum (SGD, LARS).
__host__ __device__ bool adam_moments(FusedRule rule) {
  return rule == FusedRule::kAdam || rule == FusedRule::kLamb;
}

// ZeroOptimizer::step's decisions, in the same order and in fp64 as there; the update scalars
// are rounded to fp32 once, as ATen rounds adam_update's double scalars for fp32 tensors.
__global__ void step_bookkeeping_kernel(const double* __restrict__ sum_of_squares,
                                        double sum_of_squares_copies,
                                        FusedStepOptions options, FusedHostInputs host_inputs,
                                        bool from_host, FusedStepState* __restrict__ state_out,
                                        float* __restrict__ loss_scale_out) {
  FusedStepState state = *state_out;
  const double squares = *sum_of_squares / sum_of_squares_copies;
  const double loss_scale = from_host ? host_inputs.loss_scale : state.loss_scale;
  // Note [Schedule step]: the schedule advances with the applied steps only.
  state.lr = from_host ? host_inputs.lr : lr_at(options.lr_schedule, state.adam_steps);
  // Note [Cycled momentum] in lr_schedule.h: at the same step as the lr.
  const double momentum =
      momentum_at(options.lr_schedule, state.adam_steps,
                  adam_moments(options.rule) ? options.beta1 : options.momentum);
  const bool overflow = options.check_overflow && !isfinite(squares);
  state.found_inf = overflow ? 1 : 0;
  state.grad_norm = 0.0;
  if (!overflow) {
    state.grad_norm = sqrt(squares) / loss_scale;
    double multiplier = 1.0 / loss_scale;
    if (options.clip_grad > 0.0) {
      // torch.nn.utils.clip_grad_norm_'s rule.
      const double clip_coefficient = options.clip_grad / (state.grad_norm + 1e-6);
      if (clip_coefficient < 1.0) multiplier *= clip_coefficient;
    }
    ++state.adam_steps;
    state.grad_multiplier = static_cast<float>(multiplier);
    state.decay_factor = static_cast<float>(1.0 - state.lr * options.weight_decay);
    state.momentum = static_cast<float>(momentum);
    if (options.rule == FusedRule::kAdam) {
      const double steps = static_cast<double>(state.adam_steps);
      const double bias_correction1 = 1.0 - pow(momentum, steps);
      const double bias_correction2 = 1.0 - pow(options.beta2, steps);
      state.one_minus_momentum = static_cast<float>(1.0 - momentum);
      state.step_size = static_cast<float>(-state.lr / bias_correction1);
      state.sqrt_bias_correction2 = static_cast<float>(sqrt(bias_correction2));
    } else if (options.rule == FusedRule::kLamb) {
      const LambCorrection correction = lamb_correction(options.lamb_bias_correction, momentum,
                                                        options.beta2, state.adam_steps);
      state.one_minus_momentum = static_cast<float>(1.0 - momentum);
      state.lamb_moment_scale = static_cast<float>(correction.moment_scale);
      state.lamb_root_scale = static_cast<float>(correction.root_scale);
      state.lamb_step = -state.lr * correction.step_scale;
    } else {
      const bool first = state.adam_steps == 1;
      state.step_size = static_cast<float>(-state.lr);
      state.buffer_keep = first ? 0.0f : static_cast<float>(momentum);
      state.gradient_share = first ? 1.0f : static_cast<float>(1.0 - options.dampening);
    }
    const bool first_ema = state.adam_steps == 1;
    state.ema_keep = first_ema ? 0.0f : static_cast<float>(options.ema_decay);
    state.ema_share = first_ema ? 1.0f : static_cast<float>(1.0 - options.ema_decay);
  }
  if (!from_host) update_loss_scale(state, overflow, options);
  ++state.global_step;
  *state_out = state;
  *loss_scale_out = static_cast<float>(state.loss_scale);
}

// The run's constants of the update rules, as their ATen operations on fp32 tensors see them.
struct AdamConstants {
  float beta2;
  float one_minus_beta2;
  float eps;
  float weight_decay;
  bool decoupled;
  bool has_weight_decay;
};

struct SgdConstants {
  float weight_decay;
  bool has_weight_decay;
  bool nesterov;
};

// One step's scalars (FusedStepState's), read once per thread.
struct StepScalars {
  float grad_multiplier;
  float decay_factor;
  float step_size;
  float sqrt_bias_correction2;
  float momentum;
  float one_minus_momentum;
  float buffer_keep;
  float gradient_share;
  float ema_keep;
  float ema_share;
  float lamb_moment_scale;
  float lamb_root_scale;
};

// Adam's moments, one element, as move_moments (optimizer.cpp): m.mul_(b1).add_(g, 1 - b1);
// v.mul_(b2).addcmul_(g, g, 1 - b2). AdamW's update and LAMB's sums both move them through here.
__device__ __forceinline__ void move_moments(float g, float beta1, float one_minus_beta1,
                                             float beta2, float one_minus_beta2, float& exp_avg,
                                             float& exp_avg_sq) {
  exp_avg = exp_avg * beta1 + one_minus_beta1 * g;
  exp_avg_sq = exp_avg_sq * beta2 + one_minus_beta2 * g * g;
}

// One element of ZeroOptimizer::step + adam_update, operation for operation:
//   grads.mul_(multiplier); p.mul_(1 - lr wd) | g = g.add(p, wd);
//   m.mul_(b1).add_(g, 1 - b1); v.mul_(b2).addcmul_(g, g, 1 - b2);
//   denom = (v.sqrt() / sqrt(bc2)).add_(eps); p.addcdiv_(m, denom, -lr / bc1)
struct AdamRule {
  static constexpr int kBuffers = 2;  // exp_avg, exp_avg_sq
  static constexpr bool kReadsGradient = true;
  AdamConstants c;
  __device__ __forceinline__ void operator()(float grad, float& weight, float& exp_avg,
                                             float& exp_avg_sq, const StepScalars& s,
                                             bool decays, float) const {
    float g = grad * s.grad_multiplier;
    if (c.has_weight_decay && decays) {
      if (c.decoupled) weight = weight * s.decay_factor;
      else g = g + c.weight_decay * weight;
    }
    move_moments(g, s.momentum, s.one_minus_momentum, c.beta2, c.one_minus_beta2, exp_avg,
                 exp_avg_sq);
    const float denom = sqrtf(exp_avg_sq) / s.sqrt_bias_correction2 + c.eps;
    weight = weight + s.step_size * exp_avg / denom;
  }
};

// One element of ZeroOptimizer::step + sgd_update (lars_update with the segment's ratio),
// operation for operation:
//   grads.mul_(multiplier); d = g.add(p, wd) (LARS: .mul_(ratio));
//   buf.mul_(momentum).add_(d, 1 - dampening) (step 1: buf = d);
//   d = nesterov ? d.add(buf, momentum) : buf; p.add_(d, -lr)
template <bool kMomentum>
struct SgdRule {
  static constexpr int kBuffers = kMomentum ? 1 : 0;  // the momentum buffer
  static constexpr bool kReadsGradient = true;
  SgdConstants c;
  __device__ __forceinline__ void operator()(float grad, float& weight, float& buffer, float&,
                                             const StepScalars& s, bool decays,
                                             float ratio) const {
    float d = grad * s.grad_multiplier;
    if (c.has_weight_decay && decays) d = d + c.weight_decay * weight;
    d = d * ratio;  // LARS's trust ratio; 1 for SGD
    if constexpr (kMomentum) {
      buffer = buffer * s.buffer_keep + s.gradient_share * d;
      d = c.nesterov ? d + s.momentum * buffer : buffer;
    }
    weight = weight + s.step_size * d;
  }
};

struct LambConstants {
  float beta2;
  float one_minus_beta2;
  float eps;
  float weight_decay;
  bool has_weight_decay;
};

// LAMB's direction from the moments, as lamb_direction (optimizer.cpp) computes it:
//   u = m.mul(moment_scale).div_(v.sqrt().mul_(root_scale).add_(eps)); u.add_(p, wd)
__device__ __forceinline__ float lamb_direction(float weight, float exp_avg, float exp_avg_sq,
                                                const LambConstants& c, float moment_scale,
                                                float root_scale, bool decays) {
  float u = (exp_avg * moment_scale) / (sqrtf(exp_avg_sq) * root_scale + c.eps);
  if (c.has_weight_decay && decays) u = u + c.weight_decay * weight;
  return u;
}

// LAMB's second half, as layer_adaptive_step's: the moments moved in launch_trust_sums, and the
// segment's ratio is the step's whole multiplier (ratio x -lr x step_scale): p.add_(u, ratio).
struct LambRule {
  static constexpr int kBuffers = 2;  // exp_avg, exp_avg_sq (read only here)
  static constexpr bool kReadsGradient = false;
  LambConstants c;
  __device__ __forceinline__ void operator()(float, float& weight, float& exp_avg,
                                             float& exp_avg_sq, const StepScalars& s,
                                             bool decays, float ratio) const {
    weight = weight + ratio * lamb_direction(weight, exp_avg, exp_avg_sq, c, s.lamb_moment_scale,
                                             s.lamb_root_scale, decays);
  }
};

// G: the gradients' element type, T: the parameters' (G is T, or float for a 16-bit T).
template <typename G, typename T>
struct UpdateArguments {
  const G* grads;
  T* params;
  float* master;  // nullptr: T is float and the parameters are the master weights
  float* buffers[2];  // the rule's state, Rule::kBuffers of them
  const bool* decay_mask;  // laid out as the state: where weight decay applies; nullptr: everywhere
  float* ema;              // laid out as the state: the weights' EMA; nullptr: none
  const FusedSegment* segments;
  int num_segments;
  const FusedStepState* state;
  const float* segment_ratios;  // LAMB, LARS: per segment (Note [Trust ratios]); nullptr: 1
};

// No __restrict__ on the written arrays: with an fp32 model the weights are the parameters.
template <typename G, typename T, typename Rule>
__global__ void __launch_bounds__(kThreads) update_kernel(UpdateArguments<G, T> a, Rule rule) {
  if (a.state->found_inf) return;  // the same for every thread: the whole step is skipped
  const FusedStepState& st = *a.state;
  const StepScalars s{st.grad_multiplier, st.decay_factor,       st.step_size,
                      st.sqrt_bias_correction2, st.momentum,  st.one_minus_momentum,
                      st.buffer_keep,     st.gradient_share,   st.ema_keep,
                      st.ema_share,       st.lamb_moment_scale, st.lamb_root_scale};
  constexpr int kBuffers = Rule::kBuffers;
  const bool separate_master = a.master != nullptr;
  const int64_t thread = first_thread();
  const int64_t threads = thread_count();
  for (int seg = 0; seg < a.num_segments; ++seg) {
    const FusedSegment segment = a.segments[seg];
    // LAMB's update reads no gradient (its moments moved in the sums' pass): g stays null.
    const G* g = Rule::kReadsGradient ? a.grads + segment.grad_offset : nullptr;
    const float ratio = a.segment_ratios ? a.segment_ratios[seg] : 1.0f;
    T* p = a.params + segment.param_offset;
    float* w;
    if constexpr (std::is_same<T, float>::value)
      w = separate_master ? a.master + segment.master_offset : p;
    else
      w = a.master + segment.master_offset;
    float* b0 = kBuffers > 0 ? a.buffers[0] + segment.master_offset : nullptr;
    float* b1 = kBuffers > 1 ? a.buffers[1] + segment.master_offset : nullptr;
    const bool* mask = a.decay_mask ? a.decay_mask + segment.master_offset : nullptr;
    float* ema = a.ema ? a.ema + segment.master_offset : nullptr;

    auto update_one = [&](int64_t i) {
      float weight = w[i];
      float first = 0.0f, second = 0.0f;
      if constexpr (kBuffers > 0) first = b0[i];
      if constexpr (kBuffers > 1) second = b1[i];
      rule(g ? to_float(g[i]) : 0.0f, weight, first, second, s, mask == nullptr || mask[i],
           ratio);
      w[i] = weight;
      if (ema) ema[i] = ema[i] * s.ema_keep + s.ema_share * weight;
      if constexpr (kBuffers > 0) b0[i] = first;
      if constexpr (kBuffers > 1) b1[i] = second;
      if (separate_master) p[i] = from_float<T>(weight);
    };

    const int64_t misaligned_by = misalignment(w);
    bool vectorised = misalignment(p) == misaligned_by;
    if (g) vectorised = vectorised && misalignment(g) == misaligned_by;
    if constexpr (kBuffers > 0) vectorised = vectorised && misalignment(b0) == misaligned_by;
    if constexpr (kBuffers > 1) vectorised = vectorised && misalignment(b1) == misaligned_by;
    if (mask) vectorised = vectorised && misalignment(mask) == misaligned_by;
    if (ema) vectorised = vectorised && misalignment(ema) == misaligned_by;
    // Not vectorised: the whole segment is "head", element by element.
    const int64_t head = vectorised ? head_elements(segment.numel, misaligned_by) : segment.numel;
    for (int64_t i = thread; i < head; i += threads) update_one(i);
    if (!vectorised) continue;
    const int64_t vectors = (segment.numel - head) / kVectorElements;
    for (int64_t j = thread; j < vectors; j += threads) {
      const int64_t i = head + j * kVectorElements;
      Vector<G> gv{};
      if (g) gv = *reinterpret_cast<const Vector<G>*>(g + i);
      Vector<float> wv = *reinterpret_cast<const Vector<float>*>(w + i);
      Vector<float> first{}, second{};
      if constexpr (kBuffers > 0) first = *reinterpret_cast<const Vector<float>*>(b0 + i);
      if constexpr (kBuffers > 1) second = *reinterpret_cast<const Vector<float>*>(b1 + i);
      Vector<bool> decays;
      if (mask) decays = *reinterpret_cast<const Vector<bool>*>(mask + i);
#pragma unroll
      for (int k = 0; k < kVectorElements; ++k)
        rule(to_float(gv.element[k]), wv.element[k], first.element[k], second.element[k], s,
             mask == nullptr || decays.element[k], ratio);
      *reinterpret_cast<Vector<float>*>(w + i) = wv;
      if (ema) {
        Vector<float> ev = *reinterpret_cast<const Vector<float>*>(ema + i);
#pragma unroll
        for (int k = 0; k < kVectorElements; ++k)
          ev.element[k] = ev.element[k] * s.ema_keep + s.ema_share * wv.element[k];
        *reinterpret_cast<Vector<float>*>(ema + i) = ev;
      }
      if constexpr (kBuffers > 0) *reinterpret_cast<Vector<float>*>(b0 + i) = first;
      if constexpr (kBuffers > 1) *reinterpret_cast<Vector<float>*>(b1 + i) = second;
      if (separate_master) {
        Vector<T> pv;
#pragma unroll
        for (int k = 0; k < kVectorElements; ++k) pv.element[k] = from_float<T>(wv.element[k]);
        *reinterpret_cast<Vector<T>*>(p + i) = pv;
      }
    }
    for (int64_t i = head + vectors * kVectorElements + thread; i < segment.numel; i += threads)
      update_one(i);
  }
}

LambConstants lamb_constants(const FusedStepOptions& options) {
  return {static_cast<float>(options.beta2), static_cast<float>(1.0 - options.beta2),
          static_cast<float>(options.eps), static_cast<float>(options.weight_decay),
          options.weight_decay != 0.0};
}

template <typename G>
struct TrustSumsArguments {
  const G* grads;
  const float* weights;  // the master weights (master_offset), or the fp32 parameters (param_offset)
  bool master;
  float* exp_avg;        // LAMB's moments; nullptr for LARS
  float* exp_avg_sq;
  const FusedSegment* segments;
  const FusedTrustSegment* trust_segments;
  int num_segments;
  const FusedStepState* state;
  double* segment_partials;  // [gridDim.x, num_segments, 2]
};

// Note [Trust ratios]: each block's sums of w^2 and of LAMB's u^2 (moving the moments as
// lamb_direction does) or LARS's (g x multiplier)^2, per segment. Element by element: LAMB and
// LARS are not the step's hot path.
template <typename G, bool kLamb>
__global__ void __launch_bounds__(kThreads)
    trust_sums_kernel(TrustSumsArguments<G> a, LambConstants c) {
  if (a.state->found_inf) return;
  const FusedStepState& st = *a.state;
  const int64_t thread = first_thread();
  const int64_t threads = thread_count();
  for (int seg = 0; seg < a.num_segments; ++seg) {
    const FusedSegment segment = a.segments[seg];
    const bool decays = (a.trust_segments[seg].flags & kTrustDecays) != 0;
    const G* g = a.grads + segment.grad_offset;
    const float* w = a.weights + (a.master ? segment.master_offset : segment.param_offset);
    double weight_squares = 0.0, other_squares = 0.0;
    for (int64_t i = thread; i < segment.numel; i += threads) {
      const float weight = w[i];
      const float grad = to_float(g[i]) * st.grad_multiplier;
      float measured = grad;
      if constexpr (kLamb) {
        float* m = a.exp_avg + segment.master_offset;
        float* v = a.exp_avg_sq + segment.master_offset;
        move_moments(grad, st.momentum, st.one_minus_momentum, c.beta2, c.one_minus_beta2, m[i],
                     v[i]);
        measured = lamb_direction(weight, m[i], v[i], c, st.lamb_moment_scale,
                                  st.lamb_root_scale, decays);
      }
      weight_squares += squared(weight);
      other_squares += squared(measured);
    }
    double sums[2] = {weight_squares, other_squares};
    block_sums(sums);
    if (threadIdx.x == 0) {
      double* partial = a.segment_partials + (static_cast<int64_t>(blockIdx.x) * a.num_segments + seg) * 2;
      partial[0] = sums[0];
      partial[1] = sums[1];
    }
  }
}

// One block per segment: the blocks' partial sums, in block order, into its parameter's place.
__global__ void __launch_bounds__(kThreads)
    finish_trust_sums_kernel(const double* __restrict__ segment_partials, int num_partials,
                             const FusedTrustSegment* __restrict__ trust_segments,
                             int num_segments, int num_parameters,
                             const FusedStepState* __restrict__ state,
                             double* __restrict__ parameter_squares) {
  if (state->found_inf) return;
  const int seg = blockIdx.x;
  double weight_squares = 0.0, other_squares = 0.0;
  for (int b = threadIdx.x; b < num_partials; b += kThreads) {
    const double* partial = segment_partials + (static_cast<int64_t>(b) * num_segments + seg) * 2;
    weight_squares += partial[0];
    other_squares += partial[1];
  }
  double sums[2] = {weight_squares, other_squares};
  block_sums(sums);
  if (threadIdx.x == 0) {
    const int p = trust_segments[seg].parameter;
    parameter_squares[p] = sums[0];
    parameter_squares[num_parameters + p] = sums[1];
  }
}

// layer_adaptive_step's ratios (trust_ratio.h), one thread per segment.
__global__ void __launch_bounds__(kThreads)
    trust_ratios_kernel(const double* __restrict__ parameter_squares,
                        const FusedTrustSegment* __restrict__ trust_segments, int num_segments,
                        int num_parameters, const FusedStepState* __restrict__ state,
                        FusedStepOptions options, float* __restrict__ segment_ratios) {
  if (state->found_inf) return;
  for (int seg = threadIdx.x; seg < num_segments; seg += kThreads) {
    const FusedTrustSegment trust = trust_segments[seg];
    const double weight_norm = sqrt(parameter_squares[trust.parameter]);
    const double other_norm = sqrt(parameter_squares[num_parameters + trust.parameter]);
    double ratio = 1.0;
    if (options.rule == FusedRule::kLamb) {
      ratio = state->lamb_step * lamb_trust_ratio(weight_norm, other_norm, options.min_trust_ratio,
                                                  options.max_trust_ratio);
    } else if (trust.flags & kTrustAdapts) {
      const double weight_decay = (trust.flags & kTrustDecays) ? options.weight_decay : 0.0;
      ratio = lars_trust_ratio(weight_norm, other_norm, options.trust_coefficient, weight_decay,
                               options.eps);
    }
    segment_ratios[seg] = static_cast<float>(ratio);
  }
}

// Checks the dtypes and launches `rule`'s update over the segments.
template <typename Rule>
void launch_update(const void* grads, KernelDtype grad_dtype, void* params, KernelDtype dtype,
                   float* master, float* buffer0, float* buffer1, const bool* decay_mask,
                   float* ema, const FusedSegment* segments, int num_segments, int grid_blocks,
                   const FusedStepState* state, const Rule& rule, cudaStream_t stream,
                   const float* segment_ratios = nullptr);

void check_grid(int num_segments, int grid_blocks, const char* what) {
  if (num_segments < 1 || grid_blocks < 1)
    throw Error(std::string("fused optimizer: ") + what + " needs at least one segment and one "
                "block (got " + std::to_string(num_segments) + " and " +
                std::to_string(grid_blocks) + ")");
}

}  // namespace

int fused_grid_blocks(int64_t partition_numel) {
  int device = 0;
  int sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t per_block = static_cast<int64_t>(kThreads) * kVectorElements;
  const int64_t wanted = (partition_numel + per_block - 1) / per_block;
  return static_cast<int>(std::clamp<int64_t>(wanted, 1, static_cast<int64_t>(sms) * kBlocksPerSm));
}

void launch_grad_sum_of_squares(const void* grads, KernelDtype dtype, const FusedSegment* segments,
                                int num_segments, int grid_blocks, double* block_partials,
                                double* sum_of_squares, cudaStream_t stream) {
  check_grid(num_segments, grid_blocks, "the sum of squares");
  with_element_type(dtype, [&](auto element) {
    using T = decltype(element);
    grad_sum_of_squares_kernel<T><<<grid_blocks, kThreads, 0, stream>>>(
        static_cast<const T*>(grads), segments, num_segments, block_partials);
  });
  CUDA_CHECK(cudaGetLastError());
  finish_sum_of_squares_kernel<<<1, kThreads, 0, stream>>>(block_partials, grid_blocks,
                                                           sum_of_squares);
  CUDA_CHECK(cudaGetLastError());
}

void launch_step_bookkeeping(const double* sum_of_squares, double sum_of_squares_copies,
                             const FusedStepOptions& options, const FusedHostInputs* host_inputs,
                             FusedStepState* state, float* loss_scale_out, cudaStream_t stream) {
  if (options.loss_scaling == FusedLossScaling::kDynamic && options.scale_window < 1)
    throw Error("fused optimizer: a dynamic loss scale needs a window of at least 1 step");
  step_bookkeeping_kernel<<<1, 1, 0, stream>>>(
      sum_of_squares, sum_of_squares_copies, options,
      host_inputs ? *host_inputs : FusedHostInputs{}, host_inputs != nullptr, state,
      loss_scale_out);
  CUDA_CHECK(cudaGetLastError());
}

void launch_adam_update(const void* grads, void* params, KernelDtype dtype, float* master,
                        float* exp_avg, float* exp_avg_sq, const FusedSegment* segments,
                        int num_segments, int grid_blocks, const FusedStepState* state,
                        const FusedStepOptions& options, cudaStream_t stream) {
  launch_adam_update(grads, dtype, params, dtype, master, exp_avg, exp_avg_sq, nullptr, nullptr,
                     segments, num_segments, grid_blocks, state, options, stream);
}

void launch_adam_update(const void* grads, KernelDtype grad_dtype, void* params, KernelDtype dtype,
                        float* master, float* exp_avg, float* exp_avg_sq, const bool* decay_mask,
                        float* ema, const FusedSegment* segments, int num_segments,
                        int grid_blocks, const FusedStepState* state,
                        const FusedStepOptions& options, cudaStream_t stream) {
  check_grid(num_segments, grid_blocks, "the Adam update");
  const AdamRule rule{{static_cast<float>(options.beta2), static_cast<float>(1.0 - options.beta2),
                       static_cast<float>(options.eps), static_cast<float>(options.weight_decay),
                       options.decoupled_weight_decay, options.weight_decay != 0.0}};
  launch_update(grads, grad_dtype, params, dtype, master, exp_avg, exp_avg_sq, decay_mask, ema,
                segments, num_segments, grid_blocks, state, rule, stream);
}

void launch_sgd_update(const void* grads, KernelDtype grad_dtype, void* params, KernelDtype dtype,
                       float* master, float* momentum_buffer, const bool* decay_mask,
                       float* ema, const FusedSegment* segments, int num_segments,
                       int grid_blocks, const FusedStepState* state,
                       const FusedStepOptions& options, cudaStream_t stream,
                       const float* segment_ratios) {
  check_grid(num_segments, grid_blocks, "the SGD update");
  if ((momentum_buffer != nullptr) != options.momentum_buffer)
    throw Error("fused optimizer: SGD's momentum buffer is given exactly when the options keep one");
  const SgdConstants constants{static_cast<float>(options.weight_decay),
                               options.weight_decay != 0.0, options.nesterov};
  if (options.momentum_buffer)
    launch_update(grads, grad_dtype, params, dtype, master, momentum_buffer, nullptr, decay_mask,
                  ema, segments, num_segments, grid_blocks, state, SgdRule<true>{constants},
                  stream, segment_ratios);
  else
    launch_update(grads, grad_dtype, params, dtype, master, nullptr, nullptr, decay_mask,
                  ema, segments, num_segments, grid_blocks, state, SgdRule<false>{constants},
                  stream, segment_ratios);
}

void launch_lamb_update(void* params, KernelDtype dtype, float* master, float* exp_avg,
                        float* exp_avg_sq, const bool* decay_mask, float* ema,
                        const FusedSegment* segments, int num_segments, int grid_blocks,
                        const FusedStepState* state, const FusedStepOptions& options,
                        const float* segment_ratios, cudaStream_t stream) {
  check_grid(num_segments, grid_blocks, "the LAMB update");
  // No gradient is read: the parameters' dtype stands in for its type.
  launch_update(nullptr, dtype, params, dtype, master, exp_avg, exp_avg_sq, decay_mask, ema,
                segments, num_segments, grid_blocks, state, LambRule{lamb_constants(options)},
                stream, segment_ratios);
}

void launch_trust_sums(const void* grads, KernelDtype grad_dtype, const void* params,
                       KernelDtype dtype, const float* master, float* exp_avg, float* exp_avg_sq,
                       const FusedSegment* segments, const FusedTrustSegment* trust_segments,
                       int num_segments, int num_parameters, int grid_blocks,
                       const FusedStepState* state, const FusedStepOptions& options,
                       double* segment_partials, double* parameter_squares, cudaStream_t stream) {
  check_grid(num_segments, grid_blocks, "the trust ratios' sums");
  if ((master == nullptr) != (dtype == KernelDtype::kFloat32))
    throw Error("fused optimizer: fp16/bf16 parameters need fp32 master weights, and fp32 "
                "parameters are their own");
  const bool lamb = options.rule == FusedRule::kLamb;
  if (lamb != (exp_avg != nullptr && exp_avg_sq != nullptr))
    throw Error("fused optimizer: LAMB's sums move its moments, and only LAMB's do");
  CUDA_CHECK(cudaMemsetAsync(parameter_squares, 0, 2 * sizeof(double) * num_parameters, stream));
  // The weights: the master weights, or the fp32 parameters themselves.
  const float* weights = master ? master : static_cast<const float*>(params);
  const LambConstants constants = lamb_constants(options);
  with_element_type(grad_dtype, [&](auto grad_element) {
    using G = decltype(grad_element);
    const TrustSumsArguments<G> a{static_cast<const G*>(grads), weights, master != nullptr,
                                  exp_avg, exp_avg_sq, segments, trust_segments, num_segments,
                                  state, segment_partials};
    if (lamb)
      trust_sums_kernel<G, true><<<grid_blocks, kThreads, 0, stream>>>(a, constants);
    else
      trust_sums_kernel<G, false><<<grid_blocks, kThreads, 0, stream>>>(a, constants);
  });
  CUDA_CHECK(cudaGetLastError());
  finish_trust_sums_kernel<<<num_segments, kThreads, 0, stream>>>(
      segment_partials, grid_blocks, trust_segments, num_segments, num_parameters, state,
      parameter_squares);
  CUDA_CHECK(cudaGetLastError());
}

void launch_trust_ratios(const double* parameter_squares, const FusedTrustSegment* trust_segments,
                         int num_segments, int num_parameters, const FusedStepState* state,
                         const FusedStepOptions& options, float* segment_ratios,
                         cudaStream_t stream) {
  trust_ratios_kernel<<<1, kThreads, 0, stream>>>(parameter_squares, trust_segments, num_segments,
                                                  num_parameters, state, options, segment_ratios);
  CUDA_CHECK(cudaGetLastError());
}

namespace {

template <typename Rule>
void launch_update(const void* grads, KernelDtype grad_dtype, void* params, KernelDtype dtype,
                   float* master, float* buffer0, float* buffer1, const bool* decay_mask,
                   float* ema, const FusedSegment* segments, int num_segments, int grid_blocks,
                   const FusedStepState* state, const Rule& rule, cudaStream_t stream,
                   const float* segment_ratios) {
  if (grad_dtype != dtype && grad_dtype != KernelDtype::kFloat32)
    throw Error("fused optimizer: gradients must be of the parameters' dtype or fp32");
  if ((master == nullptr) != (dtype == KernelDtype::kFloat32))
    throw Error("fused optimizer: fp16/bf16 parameters need fp32 master weights, and fp32 "
                "parameters are their own");
  const auto launch = [&](auto grad_element, auto element) {
    using G = decltype(grad_element);
    using T = decltype(element);
    const UpdateArguments<G, T> arguments{static_cast<const G*>(grads), static_cast<T*>(params),
                                          master, {buffer0, buffer1}, decay_mask, ema,
                                          segments, num_segments, state, segment_ratios};
    update_kernel<G, T, Rule><<<grid_blocks, kThreads, 0, stream>>>(arguments, rule);
  };
  with_element_type(dtype, [&](auto element) {
    if (grad_dtype == dtype) launch(element, element);
    else launch(float{}, element);  // fp32 gradients of a 16-bit model
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

}  // namespace hpc_train

// The fused optimizer on a GPU (GPU build only): the kernels of fused_optimizer.h and
// ZeroOptimizer::step_on_device against a float64 reference written here, on fresh random inputs
// every run (the seed is printed; HPC_TRAIN_TEST_SEED=<seed> repeats a run), plus fp16 overflow
// handling against the host LossScaler and CUDA-graph replay against eager steps.
//
// Note [Fused test tolerances]
// The reference advances each step in fp64 from exactly the fp32 values the device started the
// step from, with exactly the gradients the device read, so the only differences are the
// device's fp32 roundings in that one step (and fp32-rounded hyper-parameters). Each device
// result is a handful of fp32 operations on terms whose sizes the reference knows, so its error
// is bounded by the unit roundoff u = 2^-24 times those sizes: e.g. m' = b1 m + (1 - b1) g is
// within ~4u (b1|m| + (1 - b1)|g|) plus what g's own error brings; sqrt, the denominator and the
// division carry it on to the weight (reference_adam spells the chain out). The test allows 4x
// that bound, so a pass does not hang on FMA contraction or the order of operations, while any
// wrong term (a wrong beta, bias correction, step count, learning rate, multiplier or index)
// moves a value by far more than a few ulps of its terms. Norms are summed in fp64 on both
// sides (in different orders): relative 1e-9. Casts to the model dtype must be bit-exact.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "hpc_train/comm/comm.h"
#include "hpc_train/error.h"
#include "hpc_train/comm/flat_parameters.h"
#include "hpc_train/optim/fused_optimizer.h"
#include "hpc_train/optim/loss_scaler.h"
#include "hpc_train/optim/optimizer.h"
#include "hpc_train/comm/reducer.h"
#include "hpc_train/optim/zero_optimizer.h"
#include "hpc_train/runtime/test_hooks.h"
#include "test_seed.h"

namespace {

using namespace hpc_train;

constexpr double kUnitRoundoff = 0x1p-24;  // fp32
constexpr double kSafety = 4.0;            // Note [Fused test tolerances]
constexpr double kNormTolerance = 1e-9;    // relative, fp64 sums in different orders

uint64_t test_seed() { return hpc_train::testing::test_seed("test_fused_optimizer"); }

// A generator per test, so that one test's draws do not depend on which others ran.
std::mt19937_64 generator_for(uint64_t salt) {
  torch::manual_seed(test_seed() ^ (salt * 0x9E3779B97F4A7C15ull));
  return std::mt19937_64(test_seed() ^ salt);
}

int64_t uniform_int(std::mt19937_64& gen, int64_t low, int64_t high) {
  return std::uniform_int_distribution<int64_t>(low, high)(gen);
}
double uniform(std::mt19937_64& gen, double low, double high) {
  return std::uniform_real_distribution<double>(low, high)(gen);
}

at::ScalarType scalar_type_of(KernelDtype dtype) {
  switch (dtype) {
    case KernelDtype::kFloat32: return at::kFloat;
    case KernelDtype::kFloat16: return at::kHalf;
    case KernelDtype::kBFloat16: return at::kBFloat16;
  }
  return at::kFloat;
}

const char* name_of(KernelDtype dtype) {
  return dtype == KernelDtype::kFloat32 ? "fp32" : dtype == KernelDtype::kFloat16 ? "fp16" : "bf16";
}

std::vector<double> host_doubles(const at::Tensor& t) {
  const at::Tensor d = t.detach().to(at::kCPU).to(at::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

at::TensorOptions on_gpu(at::ScalarType type) {
  return at::TensorOptions().dtype(type).device(at::Device(at::kCUDA, 0));
}

// Counts values outside their tolerance and describes the worst ones, for a one-run diagnosis.
class Comparison {
 public:
  explicit Comparison(std::string what) : what_(std::move(what)) {}
  void check(const std::string& where, double got, double want, double tolerance) {
    const double error = std::abs(got - want);
    const double ratio = tolerance > 0 ? error / tolerance : (error == 0 ? 0.0 : INFINITY);
    ++checked_;
    if (!(ratio <= worst_ratio_) && !(std::isnan(ratio) && std::isnan(worst_ratio_))) {
      worst_ratio_ = std::isnan(ratio) ? NAN : std::max(worst_ratio_, ratio);
      worst_ = describe(where, got, want, tolerance);
    }
    if (!(error <= tolerance)) {
      if (failures_ < 5) listed_ += "\n    " + describe(where, got, want, tolerance);
      ++failures_;
    }
  }
  int64_t failures() const { return failures_; }
  std::string summary() const {
    std::ostringstream out;
    out << what_ << ": " << failures_ << " of " << checked_ << " outside tolerance; worst "
        << "error/tolerance " << worst_ratio_ << " at " << worst_ << listed_;
    return out.str();
  }

 private:
  static std::string describe(const std::string& where, double got, double want, double tol) {
    char text[256];
    std::snprintf(text, sizeof text, "%s: device %.9g, reference %.9g, |diff| %.3g, tolerance %.3g",
                  where.c_str(), got, want, std::abs(got - want), tol);
    return text;
  }
  std::string what_;
  int64_t checked_ = 0;
  int64_t failures_ = 0;
  double worst_ratio_ = 0.0;
  std::string worst_ = "-";
  std::string listed_;
};

// This step's scalars as the reference computes them (fp64, ZeroOptimizer::step's rules).
struct ReferenceScalars {
  double multiplier = 1.0;
  double lr = 0.0;
  double bias_correction1 = 1.0;
  double bias_correction2 = 1.0;
  double grad_norm = 0.0;
  bool clipped = false;
};

ReferenceScalars reference_scalars(double sum_of_squares, double loss_scale, double lr,
                                   int64_t adam_step, double clip_grad,
                                   const OptimizerOptions& adam) {
  ReferenceScalars s;
  s.grad_norm = std::sqrt(sum_of_squares) / loss_scale;
  s.multiplier = 1.0 / loss_scale;
  if (clip_grad > 0.0 && clip_grad / (s.grad_norm + 1e-6) < 1.0) {
    s.multiplier *= clip_grad / (s.grad_norm + 1e-6);
    s.clipped = true;
  }
  s.lr = lr;
  s.bias_correction1 = 1.0 - std::pow(adam.beta1, static_cast<double>(adam_step));
  s.bias_correction2 = 1.0 - std::pow(adam.beta2, static_cast<double>(adam_step));
  return s;
}

// One element of unscale + clip + Adam/AdamW in fp64, and the bound on the fp32 device result's
// error from the same inputs (Note [Fused test tolerances]).
struct ReferenceAdam {
  double weight, exp_avg, exp_avg_sq;
  double weight_tolerance, exp_avg_tolerance, exp_avg_sq_tolerance;
};

ReferenceAdam reference_adam(double grad, double w, double m, double v, const ReferenceScalars& s,
                             const OptimizerOptions& h) {
  const double u = kUnitRoundoff;
  double g = grad * s.multiplier;
  double g_size = std::abs(g);  // what the error of the device's g scales with
  double w_decayed = w;
  if (h.weight_decay != 0.0) {
    if (h.decoupled_weight_decay()) {
      w_decayed = w * (1.0 - s.lr * h.weight_decay);
    } else {
      g += h.weight_decay * w;
      g_size += h.weight_decay * std::abs(w);
    }
  }
  const double m1 = h.beta1 * m + (1.0 - h.beta1) * g;
  const double v1 = h.beta2 * v + (1.0 - h.beta2) * g * g;
  const double sqrt_bc2 = std::sqrt(s.bias_correction2);
  const double denom = std::sqrt(v1) / sqrt_bc2 + h.eps;
  const double step = s.lr / s.bias_correction1;
  const double update = step * m1 / denom;
  const double w2 = w_decayed - update;

  const double m_size = h.beta1 * std::abs(m) + (1.0 - h.beta1) * g_size;
  const double v_size = h.beta2 * v + (1.0 - h.beta2) * g_size * g_size;
  const double dg = 3 * u * g_size;
  const double dm = 4 * u * m_size + (1.0 - h.beta1) * dg + u * std::abs(m1);
  const double dv = 4 * u * v_size + (1.0 - h.beta2) * (2 * g_size + dg) * dg + u * v1;
  const double dsqrt = std::min(v1 > 0 ? dv / (2 * std::sqrt(v1)) : INFINITY, std::sqrt(dv)) +
                       u * std::sqrt(v1);
  const double ddenom = dsqrt / sqrt_bc2 + 3 * u * denom;
  const double denom_low = denom - ddenom;
  const double dupdate =
      denom_low > 0 ? step * (dm / denom_low + std::abs(m1) * ddenom / (denom * denom_low)) +
                          4 * u * std::abs(update)
                    : INFINITY;
  const double dw = 2 * u * std::abs(w) + dupdate + u * std::abs(w2);
  return {w2, m1, v1, kSafety * dw, kSafety * dm, kSafety * dv};
}

// ---------------------------------------------------------------------------------------------
// The kernels alone, on hand-made segment tables: random sizes (1 element to ~70k, most not a
// multiple of 4), random gaps so that the arrays of a segment are aligned alike or not (the
// vectorised and the element-wise paths), sentinels in the gaps that must stay untouched, and
// grids of 1, 3 and the natural number of blocks (grid-stride loops that wrap many times).

struct KernelLayout {
  std::vector<FusedSegment> segments;
  int64_t grad_numel = 0;
  int64_t master_numel = 0;
  int64_t param_numel = 0;
  int64_t partition_numel = 0;
};

KernelLayout random_kernel_layout(std::mt19937_64& gen) {
  KernelLayout layout;
  const int64_t count = uniform_int(gen, 1, 7);
  auto gap = [&] { return uniform_int(gen, 0, 7); };
  layout.grad_numel = gap();
  layout.master_numel = gap();
  layout.param_numel = gap();
  for (int64_t s = 0; s < count; ++s) {
    const int64_t kind = uniform_int(gen, 0, 2);
    const int64_t numel = kind == 0   ? uniform_int(gen, 1, 9)
                          : kind == 1 ? uniform_int(gen, 10, 3000)
                                      : uniform_int(gen, 5000, 70000);
    layout.segments.push_back({numel, layout.grad_numel, layout.master_numel, layout.param_numel});
    layout.grad_numel += numel + gap();
    layout.master_numel += numel + gap();
    layout.param_numel += numel + gap();
    layout.partition_numel += numel;
  }
  return layout;
}

std::string layout_text(const KernelLayout& layout) {
  std::ostringstream out;
  out << layout.segments.size() << " segments {numel, grad, master, param offsets}:";
  for (const FusedSegment& s : layout.segments)
    out << " {" << s.numel << ", " << s.grad_offset << ", " << s.master_offset << ", "
        << s.param_offset << "}";
  return out.str();
}

// Which elements of a buffer of `numel` the segments cover, by their offsets' `member`.
std::vector<bool> covered(const KernelLayout& layout, int64_t numel,
                          int64_t FusedSegment::*member) {
  std::vector<bool> mask(numel, false);
  for (const FusedSegment& s : layout.segments)
    for (int64_t i = 0; i < s.numel; ++i) mask[s.*member + i] = true;
  return mask;
}

void expect_gaps_unchanged(const std::vector<double>& before, const std::vector<double>& after,
                           const std::vector<bool>& mask, const char* what) {
  int64_t changed = 0;
  int64_t first = -1;
  for (size_t i = 0; i < before.size(); ++i) {
    if (mask[i]) continue;
    if (!(before[i] == after[i])) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++changed;
    }
  }
  EXPECT_EQ(changed, 0) << what << ": " << changed << " element(s) outside every segment were "
                        << "written, the first at " << first << " (an out-of-bounds write)";
}

FusedStepState read_state(const at::Tensor& bytes) {
  const at::Tensor host = bytes.to(at::kCPU);
  FusedStepState state;
  std::memcpy(&state, host.data_ptr(), sizeof state);
  return state;
}

at::Tensor upload_state(const FusedStepState& state) {
  at::Tensor host = at::empty({static_cast<int64_t>(sizeof state)}, at::kByte);
  std::memcpy(host.data_ptr(), &state, sizeof state);
  return host.to(at::Device(at::kCUDA, 0));
}

struct KernelCase {
  KernelDtype dtype;
  bool decoupled;
  bool clip;
  int grid;  // 0: fused_grid_blocks; else this many blocks
};

void run_kernel_case(const KernelCase& c, std::mt19937_64& gen) {
  const at::ScalarType type = scalar_type_of(c.dtype);
  const bool separate_master = c.dtype != KernelDtype::kFloat32;
  const KernelLayout layout = random_kernel_layout(gen);
  const int grid = c.grid > 0 ? c.grid : fused_grid_blocks(layout.partition_numel);
  std::ostringstream label;
  label << name_of(c.dtype) << (c.decoupled ? " AdamW" : " Adam+L2")
        << (c.clip ? ", clipped" : "") << ", grid " << grid << ", " << layout_text(layout);
  SCOPED_TRACE(label.str());

  OptimizerOptions adam;
  adam.beta1 = uniform(gen, 0.8, 0.95);
  adam.beta2 = uniform(gen, 0.99, 0.9995);
  adam.eps = std::pow(10.0, uniform(gen, -9, -6));
  adam.weight_decay = uniform(gen, 0.0, 0.1);
  adam.kind = c.decoupled ? OptimizerKind::kAdamW : OptimizerKind::kAdam;
  FusedStepOptions options;
  options.beta1 = adam.beta1;
  options.beta2 = adam.beta2;
  options.eps = adam.eps;
  options.weight_decay = adam.weight_decay;
  options.decoupled_weight_decay = adam.decoupled_weight_decay();
  options.check_overflow = c.dtype == KernelDtype::kFloat16;

  const double loss_scale = c.dtype == KernelDtype::kFloat16 ? 1024.0 : 1.0;
  FusedStepState state;
  state.adam_steps = uniform_int(gen, 0, 4);
  state.global_step = state.adam_steps + uniform_int(gen, 0, 3);
  state.loss_scale = loss_scale;
  // A linear warm-up still under way: each applied step changes the learning rate.
  options.lr_schedule.kind = LrScheduleKind::kWarmup;
  options.lr_schedule.lr = std::pow(10.0, uniform(gen, -4, -2));
  options.lr_schedule.warmup_steps = 16;
  options.lr_schedule.warmup_start_ratio = uniform(gen, 0.0, 0.5);

  // Gradients for every step up front: the clip threshold sits below the first step's norm.
  const int kSteps = 3;
  std::vector<at::Tensor> grads_by_step;
  for (int step = 0; step < kSteps; ++step) {
    at::Tensor g = at::randn({layout.grad_numel}, at::kDouble) * 1e3;  // gaps: must not count
    for (const FusedSegment& s : layout.segments) {
      const double size = std::pow(10.0, uniform(gen, -3, 0));
      g.narrow(0, s.grad_offset, s.numel).copy_(at::randn({s.numel}, at::kDouble) * size * loss_scale);
      if (s.numel > 2) g[s.grad_offset + 1] = 0.0;
    }
    grads_by_step.push_back(g.to(type).to(at::Device(at::kCUDA, 0)));
  }
  if (c.clip) {
    double first = 0.0;
    for (const FusedSegment& s : layout.segments)
      first += grads_by_step[0].narrow(0, s.grad_offset, s.numel).to(at::kDouble).pow(2).sum().item<double>();
    options.clip_grad = 0.5 * std::sqrt(first) / loss_scale;
  }

  at::Tensor params = at::randn({layout.param_numel}, on_gpu(at::kFloat)).to(type);
  at::Tensor master = separate_master ? at::randn({layout.master_numel}, on_gpu(at::kFloat)) : at::Tensor();
  at::Tensor exp_avg = at::randn({layout.master_numel}, on_gpu(at::kFloat)) * 0.01;
  at::Tensor exp_avg_sq = at::rand({layout.master_numel}, on_gpu(at::kFloat)) * 1e-4;
  at::Tensor device_state = upload_state(state);
  at::Tensor loss_scale_out = at::zeros({1}, on_gpu(at::kFloat));
  at::Tensor sum_of_squares = at::zeros({1}, on_gpu(at::kDouble));
  at::Tensor partials = at::zeros({grid}, on_gpu(at::kDouble));
  at::Tensor table = at::empty({static_cast<int64_t>(layout.segments.size()), 4}, at::kLong);
  std::memcpy(table.data_ptr(), layout.segments.data(), layout.segments.size() * sizeof(FusedSegment));
  table = table.to(at::Device(at::kCUDA, 0));
  const auto* segments = reinterpret_cast<const FusedSegment*>(table.data_ptr<int64_t>());
  const int num_segments = static_cast<int>(layout.segments.size());

  const std::vector<bool> param_mask = covered(layout, layout.param_numel, &FusedSegment::param_offset);
  const std::vector<bool> master_mask = covered(layout, layout.master_numel, &FusedSegment::master_offset);

  for (int step = 0; step < kSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const at::Tensor& grads = grads_by_step[step];
    const std::vector<double> g = host_doubles(grads);
    const std::vector<double> p0 = host_doubles(params);
    const std::vector<double> w0 = separate_master ? host_doubles(master) : p0;
    const std::vector<double> m0 = host_doubles(exp_avg);
    const std::vector<double> v0 = host_doubles(exp_avg_sq);
    const FusedStepState before = read_state(device_state);

    const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
    auto* state_on_device = reinterpret_cast<FusedStepState*>(device_state.data_ptr());
    launch_grad_sum_of_squares(grads.data_ptr(), c.dtype, segments, num_segments, grid,
                               partials.data_ptr<double>(), sum_of_squares.data_ptr<double>(), stream);
    launch_step_bookkeeping(sum_of_squares.data_ptr<double>(), 1.0, options, nullptr, state_on_device,
                            loss_scale_out.data_ptr<float>(), stream);
    launch_adam_update(grads.data_ptr(), params.data_ptr(), c.dtype,
                       separate_master ? master.data_ptr<float>() : nullptr,
                       exp_avg.data_ptr<float>(), exp_avg_sq.data_ptr<float>(), segments,
                       num_segments, grid, state_on_device, options, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << "the kernels failed";

    const FusedStepState after = read_state(device_state);
    double squares = 0.0;
    for (const FusedSegment& s : layout.segments)
      for (int64_t i = 0; i < s.numel; ++i) squares += g[s.grad_offset + i] * g[s.grad_offset + i];
    // Note [Schedule step]: the schedule's step is the applied steps, not global_step.
    const double lr = lr_at(options.lr_schedule, before.adam_steps);
    const ReferenceScalars scalars = reference_scalars(
        squares, loss_scale, lr, before.adam_steps + 1, options.clip_grad, adam);
    EXPECT_NEAR(host_doubles(sum_of_squares)[0], squares, kNormTolerance * squares) << "sum of squares";
    EXPECT_NEAR(after.grad_norm, scalars.grad_norm, kNormTolerance * scalars.grad_norm) << "grad norm";
    EXPECT_DOUBLE_EQ(after.lr, lr) << "learning rate at applied step " << before.adam_steps;
    EXPECT_EQ(after.global_step, before.global_step + 1);
    EXPECT_EQ(after.adam_steps, before.adam_steps + 1);
    EXPECT_EQ(after.found_inf, 0);
    EXPECT_NEAR(after.grad_multiplier, scalars.multiplier, 2 * kUnitRoundoff * scalars.multiplier)
        << "multiplier (clipped: " << scalars.clipped << ")";
    EXPECT_EQ(host_doubles(loss_scale_out)[0], loss_scale);
    if (c.clip && step == 0) {
      EXPECT_TRUE(scalars.clipped) << "the clip threshold must bite on step 0";
    }

    const std::vector<double> p1 = host_doubles(params);
    const std::vector<double> w1 = separate_master ? host_doubles(master) : p1;
    const std::vector<double> m1 = host_doubles(exp_avg);
    const std::vector<double> v1 = host_doubles(exp_avg_sq);
    Comparison weights("weights"), first("exp_avg"), second("exp_avg_sq");
    for (size_t si = 0; si < layout.segments.size(); ++si) {
      const FusedSegment& s = layout.segments[si];
      const int64_t w_offset = separate_master ? s.master_offset : s.param_offset;
      for (int64_t i = 0; i < s.numel; ++i) {
        const int64_t wi = w_offset + i, mi = s.master_offset + i;
        const ReferenceAdam want = reference_adam(g[s.grad_offset + i], w0[wi], m0[mi], v0[mi], scalars, adam);
        const std::string where = "segment " + std::to_string(si) + " element " + std::to_string(i);
        weights.check(where, w1[wi], want.weight, want.weight_tolerance);
        first.check(where, m1[mi], want.exp_avg, want.exp_avg_tolerance);
        second.check(where, v1[mi], want.exp_avg_sq, want.exp_avg_sq_tolerance);
      }
    }
    EXPECT_EQ(weights.failures(), 0) << weights.summary();
    EXPECT_EQ(first.failures(), 0) << first.summary();
    EXPECT_EQ(second.failures(), 0) << second.summary();
    if (step == kSteps - 1) std::printf("  %s\n  %s\n", label.str().c_str(), weights.summary().c_str());

    if (separate_master) {
      // The parameters are the master weights cast to the model dtype, bit for bit.
      const at::Tensor master_host = master.to(at::kCPU);
      const at::Tensor params_host = params.to(at::kCPU);
      for (size_t si = 0; si < layout.segments.size(); ++si) {
        const FusedSegment& s = layout.segments[si];
        EXPECT_TRUE(torch::equal(params_host.narrow(0, s.param_offset, s.numel),
                                 master_host.narrow(0, s.master_offset, s.numel).to(type)))
            << "segment " << si << ": parameters differ from the master weights cast to "
            << name_of(c.dtype);
      }
      expect_gaps_unchanged(w0, w1, master_mask, "master weights");
    }
    expect_gaps_unchanged(p0, p1, param_mask, "parameters");
    expect_gaps_unchanged(m0, m1, master_mask, "exp_avg");
    expect_gaps_unchanged(v0, v1, master_mask, "exp_avg_sq");
    EXPECT_TRUE(host_doubles(grads) == g) << "the gradients must be read only";
  }
}

class FusedKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
    test_seed();
  }
};

TEST_F(FusedKernels, MatchTheFloat64ReferenceOnRandomSegments) {
  std::mt19937_64 gen = generator_for(1);
  for (KernelDtype dtype : {KernelDtype::kFloat32, KernelDtype::kFloat16, KernelDtype::kBFloat16})
    for (bool decoupled : {true, false})
      for (int grid : {0, 1, 3})
        run_kernel_case({dtype, decoupled, /*clip=*/grid != 1, grid}, gen);
}

TEST_F(FusedKernels, OverflowSkipsTheUpdateAndStillCountsTheStep) {
  std::mt19937_64 gen = generator_for(2);
  const KernelLayout layout = random_kernel_layout(gen);
  SCOPED_TRACE(layout_text(layout));
  const int grid = fused_grid_blocks(layout.partition_numel);
  FusedStepOptions options;
  options.check_overflow = true;
  options.weight_decay = 0.01;
  for (double poison : {INFINITY, -INFINITY, NAN}) {
    at::Tensor grads = (at::randn({layout.grad_numel}, on_gpu(at::kFloat)) * 10).to(at::kHalf);
    const FusedSegment& hit = layout.segments[uniform_int(gen, 0, layout.segments.size() - 1)];
    grads[hit.grad_offset + uniform_int(gen, 0, hit.numel - 1)] = poison;
    at::Tensor params = at::randn({layout.param_numel}, on_gpu(at::kFloat)).to(at::kHalf);
    at::Tensor master = at::randn({layout.master_numel}, on_gpu(at::kFloat));
    at::Tensor exp_avg = at::randn({layout.master_numel}, on_gpu(at::kFloat));
    at::Tensor exp_avg_sq = at::rand({layout.master_numel}, on_gpu(at::kFloat));
    const at::Tensor saved[] = {params.clone(), master.clone(), exp_avg.clone(), exp_avg_sq.clone()};
    FusedStepState state;
    state.global_step = 7;
    state.adam_steps = 5;
    state.loss_scale = 64;
    at::Tensor device_state = upload_state(state);
    at::Tensor loss_scale_out = at::zeros({1}, on_gpu(at::kFloat));
    at::Tensor sum_of_squares = at::zeros({1}, on_gpu(at::kDouble));
    at::Tensor partials = at::zeros({grid}, on_gpu(at::kDouble));
    at::Tensor table = at::empty({static_cast<int64_t>(layout.segments.size()), 4}, at::kLong);
    std::memcpy(table.data_ptr(), layout.segments.data(), layout.segments.size() * sizeof(FusedSegment));
    table = table.to(at::Device(at::kCUDA, 0));
    const auto* segments = reinterpret_cast<const FusedSegment*>(table.data_ptr<int64_t>());
    const int n = static_cast<int>(layout.segments.size());
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
    auto* s = reinterpret_cast<FusedStepState*>(device_state.data_ptr());
    launch_grad_sum_of_squares(grads.data_ptr(), KernelDtype::kFloat16, segments, n, grid,
                               partials.data_ptr<double>(), sum_of_squares.data_ptr<double>(), stream);
    launch_step_bookkeeping(sum_of_squares.data_ptr<double>(), 1.0, options, nullptr, s,
                            loss_scale_out.data_ptr<float>(), stream);
    launch_adam_update(grads.data_ptr(), params.data_ptr(), KernelDtype::kFloat16,
                       master.data_ptr<float>(), exp_avg.data_ptr<float>(),
                       exp_avg_sq.data_ptr<float>(), segments, n, grid, s, options, stream);
    const FusedStepState after = read_state(device_state);
    EXPECT_FALSE(std::isfinite(host_doubles(sum_of_squares)[0])) << "poison " << poison;
    EXPECT_EQ(after.found_inf, 1) << "poison " << poison;
    EXPECT_EQ(after.global_step, 8);
    EXPECT_EQ(after.adam_steps, 5);
    EXPECT_EQ(after.grad_norm, 0.0);
    const at::Tensor now[] = {params, master, exp_avg, exp_avg_sq};
    const char* names[] = {"parameters", "master", "exp_avg", "exp_avg_sq"};
    for (int i = 0; i < 4; ++i)
      EXPECT_TRUE(torch::equal(now[i], saved[i])) << names[i] << " changed on an overflowed step"
                                                  << " (poison " << poison << ")";
  }
}

// ---------------------------------------------------------------------------------------------
// ZeroOptimizer on the GPU, at one rank: the segment tables of stages 0, 1 and 2 built from a
// real bucket layout (small buckets; at one rank their slices make one segment, and
// test_zero_gpu_np3 has three ranks' tables), the device counters, and the host API.

std::vector<at::Tensor> random_parameters(std::mt19937_64& gen, at::ScalarType type) {
  std::vector<at::Tensor> parameters;
  const int64_t count = uniform_int(gen, 6, 10);
  for (int64_t i = 0; i < count; ++i) {
    std::vector<int64_t> shape;
    if (uniform_int(gen, 0, 2) == 0) shape = {uniform_int(gen, 1, 9)};
    else shape = {uniform_int(gen, 2, 40), uniform_int(gen, 3, 130)};
    parameters.push_back(at::randn(shape, on_gpu(at::kFloat)).to(type));
  }
  return parameters;
}

// A flat model with its reducer and optimizer; all three refer to each other, so they stay put.
struct DeviceModel {
  DeviceModel(const std::vector<at::Tensor>& initial, const ZeroOptions& options, Communicator& comm)
      : stage(options.stage) {
    std::vector<std::string> names;
    std::vector<at::Tensor> parameters;
    for (size_t i = 0; i < initial.size(); ++i) {
      names.push_back("p" + std::to_string(i));
      parameters.push_back(initial[i].detach().clone().requires_grad_());
    }
    ReducerOptions reducer_options;
    reducer_options.first_bucket_bytes = 512;
    reducer_options.bucket_bytes = 4096;
    reducer_options.reduction = reduction_for_zero_stage(stage);
    flat = std::make_unique<FlatParameters>(
        names, parameters, Reducer::initial_layout(parameters, reducer_options, comm.size()));
    reducer = std::make_unique<Reducer>(*flat, comm, reducer_options);
    optimizer = std::make_unique<ZeroOptimizer>(*flat, *reducer, comm, options);
  }

  // `logical`: in the model dtype, on the GPU; lands where the optimizer reads it.
  void set_gradients(const at::Tensor& logical) {
    flat->grads().copy_(flat->from_logical(logical));
    if (stage == 2) {
      reducer->begin_backward(true);
      reducer->finish_backward();
    }
  }

  int stage;
  std::unique_ptr<FlatParameters> flat;
  std::unique_ptr<Reducer> reducer;
  std::unique_ptr<ZeroOptimizer> optimizer;
};

std::string describe_report(const StepReport& r) {
  char text[320];
  std::snprintf(text, sizeof text,
                "global %lld, adam %lld, skipped %lld, scale %g, norm %.6g, lr %g, overflow %d, "
                "scaler {scale %g, hysteresis %d, steps %lld, last overflow %lld, skipped %lld}, "
                "failed %d",
                static_cast<long long>(r.global_step), static_cast<long long>(r.adam_steps),
                static_cast<long long>(r.skipped_steps), r.loss_scale, r.last_grad_norm, r.last_lr,
                r.last_overflow, r.scaler.scale, r.scaler.hysteresis_left,
                static_cast<long long>(r.scaler.steps),
                static_cast<long long>(r.scaler.last_overflow_step),
                static_cast<long long>(r.scaler.skipped_steps), r.scaler_failed);
  return text;
}

bool same_state(const FullOptimizerState& a, const FullOptimizerState& b) {
  return a.steps == b.steps && torch::equal(a.master, b.master) && torch::equal(a.exp_avg, b.exp_avg) &&
         torch::equal(a.exp_avg_sq, b.exp_avg_sq);
}

class ZeroOnDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
    test_seed();
  }
  Communicator comm_{MPI_COMM_SELF};
};

TEST_F(ZeroOnDevice, StagesMatchTheFloat64Reference) {
  std::mt19937_64 gen = generator_for(3);
  for (at::ScalarType type : {at::kFloat, at::kHalf, at::kBFloat16}) {
    for (int stage = 0; stage <= 2; ++stage) {
      for (bool decoupled : {true, false}) {
        const bool fp16 = type == at::kHalf;
        ZeroOptions options;
        options.stage = stage;
        options.optimizer = OptimizerOptions{
            1e-3, uniform(gen, 0.8, 0.95), uniform(gen, 0.99, 0.9995), 1e-8, uniform(gen, 0.0, 0.1),
            decoupled ? OptimizerKind::kAdamW : OptimizerKind::kAdam};
        options.check_overflow = fp16;
        LrScheduleParams schedule;  // a cosine from the first step, over the test's steps
        schedule.kind = LrScheduleKind::kWarmupCosine;
        schedule.lr = std::pow(10.0, uniform(gen, -4, -2));
        schedule.cosine_final_ratio = 0.1;
        schedule.total_steps = 4;
        if (decoupled) options.lr_schedule = schedule;  // else set after construction, below
        if (fp16) {
          LossScalerOptions scaling;
          scaling.initial_scale_power = 8;
          scaling.scale_window = 2;  // the scale doubles during the test
          options.loss_scaling = scaling;
        }
        const std::vector<at::Tensor> initial = random_parameters(gen, type);
        DeviceModel model(initial, options, comm_);
        if (!decoupled) model.optimizer->set_lr_schedule(schedule);
        const int64_t numel = model.flat->numel();
        std::ostringstream label;
        label << c10::toString(type) << " stage " << stage << (decoupled ? " AdamW" : " Adam+L2")
              << ", " << numel << " parameters in " << model.flat->layout().spans.size()
              << " buckets";
        SCOPED_TRACE(label.str());
        const int kSteps = 5;
        for (int step = 0; step < kSteps; ++step) {
          SCOPED_TRACE("step " + std::to_string(step));
          const StepReport before = TestHooks::read_device_report(*model.optimizer);
          const FullOptimizerState state = model.optimizer->gather_full_state();
          const at::Tensor grads =
              (at::randn({numel}, on_gpu(at::kFloat)) * 1e-2 * before.loss_scale).to(type);
          model.set_gradients(grads);
          TestHooks::step_on_device(*model.optimizer);
          const StepReport after = TestHooks::read_device_report(*model.optimizer);
          const FullOptimizerState next = model.optimizer->gather_full_state();

          const std::vector<double> g = host_doubles(grads);
          double squares = 0.0;
          for (double x : g) squares += x * x;
          const double lr = lr_at(schedule, before.adam_steps);
          const ReferenceScalars scalars = reference_scalars(squares, before.loss_scale, lr,
                                                             before.adam_steps + 1, 0.0, options.optimizer);
          EXPECT_FALSE(after.last_overflow) << describe_report(after);
          EXPECT_EQ(after.global_step, before.global_step + 1);
          EXPECT_EQ(after.adam_steps, before.adam_steps + 1);
          EXPECT_DOUBLE_EQ(after.last_lr, lr);
          EXPECT_NEAR(after.last_grad_norm, scalars.grad_norm, kNormTolerance * scalars.grad_norm);
          if (fp16) {
            LossScaler host(*options.loss_scaling);
            for (int64_t k = 0; k <= before.global_step; ++k) host.update(false);
            EXPECT_EQ(after.loss_scale, host.scale()) << describe_report(after);
            EXPECT_EQ(TestHooks::loss_scale_tensor(*model.optimizer).item<float>(),
                      static_cast<float>(host.scale()));
          }
          const std::vector<double> w0 = host_doubles(state.master), m0 = host_doubles(state.exp_avg),
                                    v0 = host_doubles(state.exp_avg_sq);
          const std::vector<double> w1 = host_doubles(next.master), m1 = host_doubles(next.exp_avg),
                                    v1 = host_doubles(next.exp_avg_sq);
          Comparison weights("weights"), first("exp_avg"), second("exp_avg_sq");
          for (int64_t i = 0; i < numel; ++i) {
            const ReferenceAdam want = reference_adam(g[i], w0[i], m0[i], v0[i], scalars, options.optimizer);
            const std::string where = "logical element " + std::to_string(i);
            weights.check(where, w1[i], want.weight, want.weight_tolerance);
            first.check(where, m1[i], want.exp_avg, want.exp_avg_tolerance);
            second.check(where, v1[i], want.exp_avg_sq, want.exp_avg_sq_tolerance);
          }
          EXPECT_EQ(weights.failures(), 0) << weights.summary();
          EXPECT_EQ(first.failures(), 0) << first.summary();
          EXPECT_EQ(second.failures(), 0) << second.summary();
          EXPECT_TRUE(torch::equal(model.flat->to_logical(model.flat->values()).cpu(),
                                   next.master.to(type).cpu()))
              << "the parameters must be the master weights cast to " << c10::toString(type);
          if (step == kSteps - 1) std::printf("  %s: %s\n", label.str().c_str(), weights.summary().c_str());
        }
      }
    }
  }
}

TEST_F(ZeroOnDevice, ClippingMatchesTheFloat64Reference) {
  std::mt19937_64 gen = generator_for(4);
  for (int stage : {0, 2}) {
    const at::ScalarType type = stage == 0 ? at::kBFloat16 : at::kFloat;
    ZeroOptions options;
    options.stage = stage;
    options.optimizer = OptimizerOptions{2e-3, 0.9, 0.999, 1e-8, 0.01, OptimizerKind::kAdamW};
    const std::vector<at::Tensor> initial = random_parameters(gen, type);
    int64_t numel = 0;
    for (const at::Tensor& p : initial) numel += p.numel();
    // Gradients ~ N(0, 0.01^2): the norm is about 0.01 sqrt(numel); clip at half of that.
    options.clip_grad = 0.005 * std::sqrt(static_cast<double>(numel));
    DeviceModel model(initial, options, comm_);
    SCOPED_TRACE(std::string(c10::toString(type)) + " stage " + std::to_string(stage));
    for (int step = 0; step < 3; ++step) {
      const FullOptimizerState state = model.optimizer->gather_full_state();
      const at::Tensor grads = (at::randn({numel}, on_gpu(at::kFloat)) * 1e-2).to(type);
      model.set_gradients(grads);
      TestHooks::step_on_device(*model.optimizer);
      const FullOptimizerState next = model.optimizer->gather_full_state();
      const StepReport after = TestHooks::read_device_report(*model.optimizer);
      const std::vector<double> g = host_doubles(grads);
      double squares = 0.0;
      for (double x : g) squares += x * x;
      const ReferenceScalars scalars =
          reference_scalars(squares, 1.0, options.optimizer.lr, step + 1, options.clip_grad, options.optimizer);
      EXPECT_TRUE(scalars.clipped) << "norm " << scalars.grad_norm << ", clip " << options.clip_grad;
      EXPECT_NEAR(after.last_grad_norm, scalars.grad_norm, kNormTolerance * scalars.grad_norm);
      const std::vector<double> w0 = host_doubles(state.master), m0 = host_doubles(state.exp_avg),
                                v0 = host_doubles(state.exp_avg_sq);
      const std::vector<double> w1 = host_doubles(next.master), m1 = host_doubles(next.exp_avg),
                                v1 = host_doubles(next.exp_avg_sq);
      Comparison weights("weights"), first("exp_avg"), second("exp_avg_sq");
      for (int64_t i = 0; i < numel; ++i) {
        const ReferenceAdam want = reference_adam(g[i], w0[i], m0[i], v0[i], scalars, options.optimizer);
        const std::string where = "logical element " + std::to_string(i);
        weights.check(where, w1[i], want.weight, want.weight_tolerance);
        first.check(where, m1[i], want.exp_avg, want.exp_avg_tolerance);
        second.check(where, v1[i], want.exp_avg_sq, want.exp_avg_sq_tolerance);
      }
      EXPECT_EQ(weights.failures(), 0) << weights.summary();
      EXPECT_EQ(first.failures(), 0) << first.summary();
      EXPECT_EQ(second.failures(), 0) << second.summary();
    }
  }
}

TEST_F(ZeroOnDevice, HostDrivenStepEqualsTheDeviceStep) {
  // step(lr, scale) runs the same kernels with the host's inputs: bit for bit the same result.
  std::mt19937_64 gen = generator_for(5);
  ZeroOptions options;
  options.stage = 1;
  options.optimizer = OptimizerOptions{3e-3, 0.9, 0.999, 1e-8, 0.05, OptimizerKind::kAdamW};
  options.clip_grad = 0.1;
  const std::vector<at::Tensor> initial = random_parameters(gen, at::kBFloat16);
  DeviceModel host_driven(initial, options, comm_);
  DeviceModel device_driven(initial, options, comm_);
  for (int step = 0; step < 4; ++step) {
    const at::Tensor grads =
        (at::randn({host_driven.flat->numel()}, on_gpu(at::kFloat)) * 1e-2).to(at::kBFloat16);
    host_driven.set_gradients(grads);
    device_driven.set_gradients(grads);
    const StepOutcome outcome = TestHooks::step(*host_driven.optimizer, 3e-3, 1.0);
    TestHooks::step_on_device(*device_driven.optimizer);
    const StepReport report = TestHooks::read_device_report(*device_driven.optimizer);
    EXPECT_FALSE(outcome.overflow);
    EXPECT_EQ(outcome.grad_norm, report.last_grad_norm);
    EXPECT_TRUE(torch::equal(host_driven.flat->values(), device_driven.flat->values())) << "step " << step;
    EXPECT_EQ(host_driven.optimizer->steps_taken(), step + 1);
  }
  EXPECT_TRUE(same_state(host_driven.optimizer->gather_full_state(),
                         device_driven.optimizer->gather_full_state()));
}

// In a world of one ZeRO's slices are the whole buckets, back to back: stages 1 and 2 must step
// bit for bit as stage 0 does, the global norm included (since append_segment in
// zero_optimizer_cuda.cpp they also run its single segment, in the same order of summation).
TEST_F(ZeroOnDevice, OneRanksStagesStepAsStageZero) {
  std::mt19937_64 gen = generator_for(11);
  for (at::ScalarType type : {at::kFloat, at::kBFloat16}) {
    ZeroOptions options;
    options.optimizer = OptimizerOptions{2e-3, 0.9, 0.999, 1e-8, 0.01, OptimizerKind::kAdamW};
    options.clip_grad = 0.1;
    const std::vector<at::Tensor> initial = random_parameters(gen, type);
    std::vector<std::unique_ptr<DeviceModel>> stages;
    for (int stage = 0; stage <= 2; ++stage) {
      options.stage = stage;
      stages.push_back(std::make_unique<DeviceModel>(initial, options, comm_));
    }
    SCOPED_TRACE(std::string(c10::toString(type)) + ", " +
                 std::to_string(stages[0]->flat->layout().spans.size()) + " buckets");
    for (int step = 0; step < 3; ++step) {
      const at::Tensor grads =
          (at::randn({stages[0]->flat->numel()}, on_gpu(at::kFloat)) * 1e-2).to(type);
      for (const std::unique_ptr<DeviceModel>& model : stages) {
        model->set_gradients(grads);
        TestHooks::step_on_device(*model->optimizer);
      }
      const StepReport stage0 = TestHooks::read_device_report(*stages[0]->optimizer);
      for (int stage = 1; stage <= 2; ++stage) {
        SCOPED_TRACE("stage " + std::to_string(stage) + ", step " + std::to_string(step));
        EXPECT_EQ(TestHooks::read_device_report(*stages[stage]->optimizer).last_grad_norm,
                  stage0.last_grad_norm);
        EXPECT_TRUE(torch::equal(stages[stage]->flat->values(), stages[0]->flat->values()));
        EXPECT_TRUE(same_state(stages[stage]->optimizer->gather_full_state(),
                               stages[0]->optimizer->gather_full_state()));
      }
    }
  }
}

// SGD (plain, with dampened momentum, Nesterov with weight decay), LAMB (its bias correction in
// the moments or in the step, the ratio bounded) and LARS (Note [Trust ratios]), a one-cycle
// schedule that cycles SGD's momentum and Adam's beta1, weight decay kept off the 1-D
// parameters, and the weights' EMA: the fused kernels against the same ZeroOptimizer on the CPU,
// whose ATen updates equal torch.optim's (test_optimizer.cpp) and the papers' rules
// (test_recipes.sh), at every stage, fp32 and bf16.
TEST_F(ZeroOnDevice, SgdLambLarsAndCycledMomentumMatchTheCpuOptimizer) {
  std::mt19937_64 gen = generator_for(17);
  struct Case {
    const char* name;
    OptimizerKind kind;
    double momentum, dampening, weight_decay;
    bool nesterov, one_cycle, no_decay_below_2d;
    LambBiasCorrection lamb_bias_correction = LambBiasCorrection::kMoments;
  };
  const Case cases[] = {
      {"sgd", OptimizerKind::kSgd, 0.0, 0.0, 0.0, false, false, false},
      {"sgd momentum dampening", OptimizerKind::kSgd, 0.9, 0.1, 5e-4, false, false, false},
      {"sgd nesterov", OptimizerKind::kSgd, 0.9, 0.0, 5e-4, true, false, false},
      {"sgd one-cycle", OptimizerKind::kSgd, 0.0, 0.0, 0.0, false, true, false},
      {"adamw one-cycle", OptimizerKind::kAdamW, 0.0, 0.0, 0.01, false, true, false},
      {"sgd no decay below 2-D", OptimizerKind::kSgd, 0.9, 0.0, 0.05, false, false, true},
      {"adamw no decay below 2-D", OptimizerKind::kAdamW, 0.0, 0.0, 0.05, false, false, true},
      {"lamb", OptimizerKind::kLamb, 0.0, 0.0, 0.01, false, false, false},
      {"lamb one-cycle, no decay below 2-D, step correction", OptimizerKind::kLamb, 0.0, 0.0,
       0.05, false, true, true, LambBiasCorrection::kStepSize},
      {"lars nesterov, no decay below 2-D", OptimizerKind::kLars, 0.9, 0.0, 5e-4, true, false,
       true},
      {"lars one-cycle", OptimizerKind::kLars, 0.0, 0.0, 5e-4, false, true, false}};
  const double ema_decay = 0.9;  // every case keeps an EMA
  for (const Case& c : cases) {
    for (at::ScalarType type : {at::kFloat, at::kBFloat16}) {
      for (int stage = 0; stage <= 2; ++stage) {
        SCOPED_TRACE(std::string(c.name) + ", " + c10::toString(type) + ", stage " +
                     std::to_string(stage));
        ZeroOptions options;
        options.stage = stage;
        options.optimizer.kind = c.kind;
        options.optimizer.lr = 0.05;
        options.optimizer.momentum = c.momentum;
        options.optimizer.dampening = c.dampening;
        options.optimizer.nesterov = c.nesterov;
        options.optimizer.weight_decay = c.weight_decay;
        options.no_decay_below_2d = c.no_decay_below_2d;
        options.ema_decay = ema_decay;
        options.optimizer.lamb_bias_correction = c.lamb_bias_correction;
        options.optimizer.min_trust_ratio = 0.01;  // LAMB's bounds
        options.optimizer.max_trust_ratio = 10.0;
        options.optimizer.trust_coefficient = 0.02;  // LARS
        if (c.one_cycle) {
          LrScheduleParams schedule;
          schedule.kind = LrScheduleKind::kOneCycle;
          schedule.lr = 0.05;
          schedule.cycle_first_steps = 2;
          schedule.cycle_second_steps = 3;
          schedule.cycle_momentum = true;
          options.lr_schedule = schedule;
        }
        const std::vector<at::Tensor> initial = random_parameters(gen, type);
        std::vector<at::Tensor> initial_cpu;
        for (const at::Tensor& t : initial) initial_cpu.push_back(t.cpu());
        DeviceModel gpu(initial, options, comm_);
        DeviceModel cpu(initial_cpu, options, comm_);
        for (int step = 0; step < 6; ++step) {
          const at::Tensor grads =
              (at::randn({gpu.flat->numel()}, on_gpu(at::kFloat)) * 1e-1).to(type);
          gpu.set_gradients(grads);
          cpu.set_gradients(grads.cpu());
          gpu.optimizer->step();
          cpu.optimizer->step();
          const at::Tensor difference = (gpu.flat->values().cpu().to(at::kFloat) -
                                         cpu.flat->values().to(at::kFloat)).abs();
          const at::Tensor size = cpu.flat->values().to(at::kFloat).abs() + 1e-3;
          // LAMB moves every element by about lr x ratio (its direction is Adam's m / sqrt(v),
          // of size ~1, scaled by |w| / |u|): the GPU's contracted multiply-adds, an ulp of the
          // direction, reach 3e-5 of the 1e-3 floor after 5 steps (H100, 2026-12-07).
          const double fp32_bound = c.kind == OptimizerKind::kLamb ? 1e-4 : 1e-5;
          const double bound = type == at::kFloat ? fp32_bound : 1e-2;
          EXPECT_LT((difference / size).max().item<double>(), bound) << "step " << step;
          // The schedule in fp64 on both; the GPU may contract a multiply-add (an ulp).
          EXPECT_NEAR(gpu.optimizer->report().last_lr, cpu.optimizer->report().last_lr,
                      1e-12 * cpu.optimizer->report().last_lr);
        }
        const FullOptimizerState g = gpu.optimizer->gather_full_state();
        const FullOptimizerState h = cpu.optimizer->gather_full_state();
        EXPECT_TRUE(torch::allclose(g.exp_avg.cpu(), h.exp_avg, 1e-5, 1e-7));
        EXPECT_TRUE(torch::allclose(g.exp_avg_sq.cpu(), h.exp_avg_sq, 1e-5, 1e-9));
        EXPECT_TRUE(torch::allclose(g.master.cpu(), h.master, 1e-5, 1e-7));
        EXPECT_TRUE(torch::allclose(g.ema.cpu(), h.ema, 1e-5, 1e-7));
        EXPECT_FALSE(torch::equal(h.ema, h.master));  // it averages, it does not copy
      }
    }
  }
}

// One fp16 run with a random overflow pattern: the device scaler must follow LossScaler::update
// step for step, and an overflowed step must change nothing but the counters.
void run_overflow_pattern(int stage, const LossScalerOptions& scaling, double overflow_probability,
                          int steps, std::mt19937_64& gen, Communicator& comm) {
  ZeroOptions options;
  options.stage = stage;
  options.optimizer = OptimizerOptions{1e-3, 0.9, 0.999, 1e-8, 0.01, OptimizerKind::kAdamW};
  options.check_overflow = true;
  options.loss_scaling = scaling;
  DeviceModel model(random_parameters(gen, at::kHalf), options, comm);
  LossScaler host(scaling);
  const int64_t numel = model.flat->numel();
  std::string pattern;
  int overflows = 0;
  for (int step = 0; step < steps; ++step) {
    const bool overflow = uniform(gen, 0, 1) < overflow_probability;
    at::Tensor grads = (at::randn({numel}, on_gpu(at::kFloat)) * 1e-2).to(at::kHalf);
    if (overflow) {
      const double poisons[] = {INFINITY, -INFINITY, NAN};
      grads[uniform_int(gen, 0, numel - 1)] = poisons[uniform_int(gen, 0, 2)];
    }
    pattern += overflow ? 'X' : '.';
    overflows += overflow;
    const StepReport before = TestHooks::read_device_report(*model.optimizer);
    const FullOptimizerState state = model.optimizer->gather_full_state();
    const at::Tensor values = model.flat->values().clone();
    model.set_gradients(grads);
    TestHooks::step_on_device(*model.optimizer);
    const StepReport after = TestHooks::read_device_report(*model.optimizer);
    bool host_failed = false;
    try {
      host.update(overflow);
    } catch (const Error&) {
      host_failed = true;
    }
    const std::string context = "stage " + std::to_string(stage) + ", step " +
                                std::to_string(step) + ", pattern " + pattern + "\n  device: " +
                                describe_report(after);
    EXPECT_EQ(after.last_overflow, overflow) << context;
    EXPECT_EQ(after.global_step, before.global_step + 1) << context;
    EXPECT_EQ(after.adam_steps, before.adam_steps + (overflow ? 0 : 1)) << context;
    EXPECT_EQ(after.scaler_failed, host_failed) << context;
    const LossScalerState want = host.state();
    EXPECT_EQ(after.scaler.scale, want.scale) << context;
    EXPECT_EQ(after.scaler.hysteresis_left, want.hysteresis_left) << context;
    EXPECT_EQ(after.scaler.steps, want.steps) << context;
    EXPECT_EQ(after.scaler.last_overflow_step, want.last_overflow_step) << context;
    EXPECT_EQ(after.scaler.skipped_steps, want.skipped_steps) << context;
    EXPECT_EQ(TestHooks::loss_scale_tensor(*model.optimizer).item<float>(),
              static_cast<float>(want.scale))
        << context;
    if (overflow) {
      EXPECT_TRUE(torch::equal(model.flat->values(), values)) << "parameters changed; " << context;
      EXPECT_TRUE(same_state(model.optimizer->gather_full_state(), state))
          << "optimizer state changed; " << context;
    } else {
      EXPECT_FALSE(torch::equal(model.flat->values(), values)) << "nothing moved; " << context;
    }
    if (host_failed || ::testing::Test::HasFailure()) break;
  }
  std::printf("  stage %d, %s scale, window %d, hysteresis %d, min %g: pattern %s (%d overflows), "
              "final scale %g\n", stage, scaling.fixed_scale > 0 ? "fixed" : "dynamic",
              scaling.scale_window, scaling.hysteresis, scaling.min_scale, pattern.c_str(),
              overflows, host.scale());
}

TEST_F(ZeroOnDevice, Fp16OverflowFollowsTheHostLossScaler) {
  std::mt19937_64 gen = generator_for(6);
  for (int stage : {0, 1, 2}) {
    LossScalerOptions dynamic;
    dynamic.initial_scale_power = static_cast<int>(uniform_int(gen, 4, 12));
    dynamic.scale_window = static_cast<int>(uniform_int(gen, 1, 4));
    dynamic.hysteresis = static_cast<int>(uniform_int(gen, 1, 3));
    dynamic.min_scale = std::ldexp(1.0, -12);
    run_overflow_pattern(stage, dynamic, 0.35, 40, gen, comm_);
  }
  LossScalerOptions fixed;
  fixed.fixed_scale = 1024;
  run_overflow_pattern(2, fixed, 0.5, 12, gen, comm_);
}

TEST_F(ZeroOnDevice, OverflowAtTheMinimumScaleSetsTheErrorFlag) {
  // 8 -> 4 -> 2 = min; the third overflow is where LossScaler::update throws.
  std::mt19937_64 gen = generator_for(7);
  LossScalerOptions scaling;
  scaling.initial_scale_power = 3;
  scaling.hysteresis = 1;
  scaling.min_scale = 2;
  run_overflow_pattern(1, scaling, 1.0, 4, gen, comm_);
  ZeroOptions options;
  options.stage = 0;
  options.check_overflow = true;
  options.loss_scaling = scaling;
  DeviceModel model(random_parameters(gen, at::kHalf), options, comm_);
  const at::Tensor poisoned = at::full({model.flat->numel()}, INFINITY, on_gpu(at::kHalf));
  for (int step = 0; step < 3; ++step) {
    EXPECT_FALSE(TestHooks::read_device_report(*model.optimizer).scaler_failed)
        << "before step " << step;
    model.set_gradients(poisoned);
    TestHooks::step_on_device(*model.optimizer);
  }
  const StepReport report = TestHooks::read_device_report(*model.optimizer);
  EXPECT_TRUE(report.scaler_failed) << describe_report(report);
  EXPECT_EQ(report.loss_scale, 2.0);
  EXPECT_EQ(report.scaler.skipped_steps, 2) << "the failing update leaves the scaler as it was";
  EXPECT_EQ(report.global_step, 3);
  EXPECT_EQ(report.adam_steps, 0);
  // The policy's read ends the run, with the host scaler's message.
  try {
    model.optimizer->report();
    ADD_FAILURE() << "report() after the device scaler failed did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp16 loss scale is already at its minimum (2)"),
              std::string::npos) << e.what();
  }
}

TEST_F(ZeroOnDevice, ResumeContinuesTheCountersAndTheScaler) {
  std::mt19937_64 gen = generator_for(8);
  LossScalerOptions scaling;
  scaling.scale_window = 3;
  ZeroOptions options;
  options.stage = 2;
  options.check_overflow = true;
  options.loss_scaling = scaling;
  options.lr_schedule = LrScheduleParams{LrScheduleKind::kWarmup, WarmupType::kLinear, 6e-3, 6, 1.0 / 6};
  const std::vector<at::Tensor> initial = random_parameters(gen, at::kHalf);
  DeviceModel first(initial, options, comm_);
  for (int step = 0; step < 4; ++step) {
    first.set_gradients((at::randn({first.flat->numel()}, on_gpu(at::kFloat)) * 1e-2).to(at::kHalf));
    TestHooks::step_on_device(*first.optimizer);
  }
  const StepReport saved = TestHooks::read_device_report(*first.optimizer);
  const FullOptimizerState state = first.optimizer->gather_full_state();
  DeviceModel second(initial, options, comm_);
  second.optimizer->load_full_state(state);
  TestHooks::load_device_state(*second.optimizer, saved.global_step, saved.adam_steps,
                               saved.scaler);
  const StepReport resumed = TestHooks::read_device_report(*second.optimizer);
  EXPECT_EQ(resumed.global_step, saved.global_step);
  EXPECT_EQ(resumed.adam_steps, saved.adam_steps);
  EXPECT_EQ(resumed.scaler.scale, saved.scaler.scale);
  EXPECT_EQ(resumed.scaler.hysteresis_left, saved.scaler.hysteresis_left);
  EXPECT_EQ(resumed.scaler.steps, saved.scaler.steps);
  EXPECT_EQ(resumed.scaler.last_overflow_step, saved.scaler.last_overflow_step);
  EXPECT_EQ(resumed.scaler.skipped_steps, saved.scaler.skipped_steps);
  EXPECT_EQ(TestHooks::loss_scale_tensor(*second.optimizer).item<float>(),
            static_cast<float>(saved.loss_scale));
  const at::Tensor grads = (at::randn({first.flat->numel()}, on_gpu(at::kFloat)) * 1e-2).to(at::kHalf);
  first.set_gradients(grads);
  second.set_gradients(grads);
  TestHooks::step_on_device(*first.optimizer);
  TestHooks::step_on_device(*second.optimizer);
  EXPECT_TRUE(torch::equal(first.flat->values(), second.flat->values()));
  EXPECT_EQ(describe_report(TestHooks::read_device_report(*first.optimizer)),
            describe_report(TestHooks::read_device_report(*second.optimizer)));
}

// Note [Schedule step]: an overflowed fp16 step does not advance the schedule (DeepSpeed steps its
// scheduler only after a step that was taken).
TEST_F(ZeroOnDevice, SkippedStepsDoNotAdvanceTheSchedule) {
  std::mt19937_64 gen = generator_for(10);
  LossScalerOptions scaling;
  scaling.initial_scale_power = 6;
  ZeroOptions options;
  options.stage = 0;
  options.check_overflow = true;
  options.loss_scaling = scaling;
  options.lr_schedule = LrScheduleParams{LrScheduleKind::kWarmup, WarmupType::kLinear, 1e-3, 10, 0.0};
  const std::vector<at::Tensor> initial = random_parameters(gen, at::kHalf);
  DeviceModel model(initial, options, comm_);
  const int64_t numel = model.flat->numel();
  const bool overflow_at[] = {false, true, true, false, false};
  int64_t applied = 0;
  for (bool overflow : overflow_at) {
    at::Tensor g = (at::randn({numel}, on_gpu(at::kFloat)) * 1e-2).to(at::kHalf);
    if (overflow) g[uniform_int(gen, 0, numel - 1)] = INFINITY;
    model.set_gradients(g);
    TestHooks::step_on_device(*model.optimizer);
    const StepReport report = TestHooks::read_device_report(*model.optimizer);
    ASSERT_EQ(report.last_overflow, overflow) << describe_report(report);
    if (overflow) continue;
    EXPECT_DOUBLE_EQ(report.last_lr, lr_at(*options.lr_schedule, applied))
        << "global step " << report.global_step << ", " << applied << " applied before it";
    ++applied;
  }
  EXPECT_EQ(TestHooks::read_device_report(*model.optimizer).adam_steps, 3);
}

TEST_F(ZeroOnDevice, GraphReplaysEqualEagerSteps) {
  // The whole step_on_device captured once and replayed: each replay must equal an eager step,
  // bit for bit, overflowed steps and loss-scale changes included.
  std::mt19937_64 gen = generator_for(9);
  LossScalerOptions scaling;
  scaling.initial_scale_power = 6;
  scaling.scale_window = 2;
  scaling.hysteresis = 2;
  ZeroOptions options;
  options.stage = 1;
  options.optimizer = OptimizerOptions{1e-3, 0.9, 0.999, 1e-8, 0.01, OptimizerKind::kAdamW};
  options.clip_grad = 0.05;
  options.check_overflow = true;
  options.loss_scaling = scaling;
  options.lr_schedule =
      LrScheduleParams{LrScheduleKind::kWarmupCosine, WarmupType::kLinear, 1e-3, 0, 0.0, 0.4, 4};
  const std::vector<at::Tensor> initial = random_parameters(gen, at::kHalf);
  DeviceModel eager(initial, options, comm_);
  DeviceModel replayed(initial, options, comm_);
  const int64_t numel = eager.flat->numel();
  const int kSteps = 8;
  std::vector<at::Tensor> grads;
  for (int step = 0; step < kSteps; ++step) {
    at::Tensor g = (at::randn({numel}, on_gpu(at::kFloat)) * 1e-2).to(at::kHalf);
    if (step == 2 || step == 3) g[uniform_int(gen, 0, numel - 1)] = step == 2 ? INFINITY : NAN;
    grads.push_back(g);
  }
  std::vector<FullOptimizerState> eager_states;
  std::vector<StepReport> eager_reports;
  std::vector<at::Tensor> eager_values;
  for (int step = 0; step < kSteps; ++step) {
    eager.set_gradients(grads[step]);
    TestHooks::step_on_device(*eager.optimizer);
    eager_states.push_back(eager.optimizer->gather_full_state());
    eager_reports.push_back(TestHooks::read_device_report(*eager.optimizer));
    eager_values.push_back(eager.flat->values().clone());
  }

  at::cuda::CUDAGraph graph;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  {
    const c10::cuda::CUDAStream capture_stream = c10::cuda::getStreamFromPool();
    const c10::cuda::CUDAStreamGuard guard(capture_stream);
    graph.capture_begin();
    TestHooks::step_on_device(*replayed.optimizer);
    graph.capture_end();
  }
  EXPECT_EQ(TestHooks::read_device_report(*replayed.optimizer).global_step, 0)
      << "capturing runs nothing";
  for (int step = 0; step < kSteps; ++step) {
    replayed.flat->grads().copy_(replayed.flat->from_logical(grads[step]));
    graph.replay();
    const StepReport report = TestHooks::read_device_report(*replayed.optimizer);
    EXPECT_EQ(describe_report(report), describe_report(eager_reports[step])) << "step " << step;
    EXPECT_TRUE(torch::equal(replayed.flat->values(), eager_values[step])) << "step " << step;
    EXPECT_TRUE(same_state(replayed.optimizer->gather_full_state(), eager_states[step]))
        << "step " << step;
  }
  std::printf("  graph: %d replays, final %s\n", kSteps,
              describe_report(TestHooks::read_device_report(*replayed.optimizer)).c_str());
}

}  // namespace

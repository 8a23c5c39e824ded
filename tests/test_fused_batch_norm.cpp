// The fused batch-norm kernels on a GPU (GPU build only; batch_norm_act.h, Note [Fused batch
// norm]): relu(bn(x) + residual) forward and backward against LibTorch's own batch_norm, add and
// ReLU run in float64 on the same inputs, for fp32, fp16 and bf16 activations (parameters in the
// same dtype, and fp32 parameters with 16-bit activations), with and without the ReLU and the
// residual, over shapes that give the kernels' layout one channel tile or several, full or idle
// threads, many row blocks or one. Fresh random inputs every run (the seed is printed;
// HPC_TRAIN_TEST_SEED=<seed> repeats a run). Also: the same inputs give the same bits twice, and
// a CUDA graph's replay of forward and backward gives the eager bits.
//
// Note [Fused batch norm tolerances]
// The inputs are the dtype's values and the reference computes from exactly those in fp64, so
// the fused result differs by its fp32 arithmetic and its one rounding to the dtype. With u the
// dtype's unit roundoff (2^-24, 2^-11, 2^-8 for fp32, fp16, bf16):
//   elementwise outputs (y, dx, dresidual), running statistics:
//       |fused - ref| <= 2u |ref| + 1e-4 max|ref|     (the second term: fp32's statistics)
//   sums over the rows (dweight, dbias):
//       |fused - ref| <= 2u |ref| + 1e-5 sum|terms|   (fp32 accumulation over up to 2^18 rows)
//   dweight also: + 4 u32 sum(|g| (|x| + |mean|) invstd), u32 = 2^-24
// The last term is x - mean's rounding in fp32, which xhat carries whatever the dtype: where the
// mean is large against the spread it cancels, and with few rows that the ReLU mostly masks,
// sum|g xhat| can be far below it ([7,128,1,1] in fp32 failed 3 runs of 50 on an H100 without
// it, by up to 1.46x the tolerance).
// The backward reference takes the ReLU's mask from the fused output, so that a value rounding
// to either side of 0 cannot flip a mask between the two. A wrong term (a missing invstd, the
// biased variance for the unbiased, a mean left out of dx, a wrong channel) moves values by a
// large fraction of max|ref|, far outside these bounds.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "hpc_train/model/batch_norm_act.h"
#include "test_seed.h"

namespace {

using hpc_train::Activation;
using hpc_train::batch_norm_act;

uint64_t test_seed() { return hpc_train::testing::test_seed("test_fused_batch_norm"); }

double unit_roundoff(c10::ScalarType dtype) {
  return dtype == torch::kFloat ? 0x1p-24 : dtype == torch::kHalf ? 0x1p-11 : 0x1p-8;
}

const torch::Device kGpu(torch::kCUDA, 0);

struct Case {
  std::vector<int64_t> shape;  // N, C, H, W
  c10::ScalarType dtype;       // activations
  c10::ScalarType param_dtype;
  bool relu;
  bool residual;

  std::string name() const {
    char text[160];
    std::snprintf(text, sizeof text, "[%lld,%lld,%lld,%lld] %s params %s%s%s",
                  static_cast<long long>(shape[0]), static_cast<long long>(shape[1]),
                  static_cast<long long>(shape[2]), static_cast<long long>(shape[3]),
                  c10::toString(dtype), c10::toString(param_dtype), relu ? " relu" : "",
                  residual ? " residual" : "");
    return text;
  }
};

torch::Tensor channels_last(const torch::Tensor& t, c10::ScalarType dtype) {
  return t.to(kGpu, dtype).contiguous(at::MemoryFormat::ChannelsLast);
}

// One case's inputs, in the case's dtypes.
struct Inputs {
  torch::Tensor x, residual, dy;
  torch::Tensor weight, bias, running_mean, running_var;

  explicit Inputs(const Case& c) {
    const int64_t channels = c.shape[1];
    const auto f64 = torch::TensorOptions().dtype(torch::kDouble).device(kGpu);
    // Per-channel offsets and spreads, so that the mean matters and channels differ.
    const torch::Tensor offset = torch::randn({1, channels, 1, 1}, f64) * 3;
    const torch::Tensor spread = torch::rand({1, channels, 1, 1}, f64) * 2 + 0.5;
    x = channels_last(torch::randn(c.shape, f64) * spread + offset, c.dtype);
    if (c.residual) residual = channels_last(torch::randn(c.shape, f64), c.dtype);
    dy = channels_last(torch::randn(c.shape, f64), c.dtype);
    weight = (torch::rand({channels}, f64) + 0.5).to(c.param_dtype);
    bias = (torch::randn({channels}, f64) * 0.5).to(c.param_dtype);
    running_mean = torch::randn({channels}, f64).to(c.param_dtype);
    running_var = (torch::rand({channels}, f64) + 0.5).to(c.param_dtype);
  }
};

// The outputs of one forward and backward.
struct Outputs {
  torch::Tensor y, dx, dresidual, dweight, dbias, running_mean, running_var;
};

torch::nn::BatchNorm2d batch_norm_for(const Inputs& in) {
  torch::nn::BatchNorm2d bn(in.weight.size(0));
  bn->to(kGpu, in.weight.scalar_type());
  torch::NoGradGuard no_grad;
  bn->weight.copy_(in.weight);
  bn->bias.copy_(in.bias);
  bn->running_mean.copy_(in.running_mean);
  bn->running_var.copy_(in.running_var);
  bn->train();
  return bn;
}

Outputs run_fused(const Case& c, const Inputs& in) {
  torch::nn::BatchNorm2d bn = batch_norm_for(in);
  const torch::Tensor x = in.x.clone().requires_grad_();
  const torch::Tensor residual =
      c.residual ? in.residual.clone().requires_grad_() : torch::Tensor();
  EXPECT_TRUE(hpc_train::fused_batch_norm_applies(x, *bn, residual)) << c.name();
  const torch::Tensor y =
      batch_norm_act(x, *bn, residual, c.relu ? Activation::kRelu : Activation::kNone);
  y.backward(in.dy);
  Outputs out;
  out.y = y.detach();
  out.dx = x.grad();
  if (c.residual) out.dresidual = residual.grad();
  out.dweight = bn->weight.grad();
  out.dbias = bn->bias.grad();
  out.running_mean = bn->running_mean.clone();
  out.running_var = bn->running_var.clone();
  EXPECT_EQ(bn->num_batches_tracked.item<double>(), 1.0);
  return out;
}

// LibTorch's batch_norm, add and ReLU in fp64 on the same inputs; backward through the mask of
// the fused output (Note [Fused batch norm tolerances]). Also the sums of |terms| of dweight
// and dbias, and of |g| (|x| + |mean|) invstd, for their tolerances.
struct Reference {
  Outputs out;
  torch::Tensor dweight_terms, dbias_terms, xhat_rounding_terms;
};

Reference run_reference(const Case& c, const Inputs& in, const torch::Tensor& fused_y) {
  auto f64 = [](const torch::Tensor& t) { return t.to(torch::kDouble); };
  const torch::Tensor x = f64(in.x).requires_grad_();
  const torch::Tensor weight = f64(in.weight).requires_grad_();
  const torch::Tensor bias = f64(in.bias).requires_grad_();
  const torch::Tensor residual = c.residual ? f64(in.residual).requires_grad_() : torch::Tensor();
  Reference ref;
  ref.out.running_mean = f64(in.running_mean);
  ref.out.running_var = f64(in.running_var);
  torch::Tensor z = torch::batch_norm(x, weight, bias, ref.out.running_mean, ref.out.running_var,
                                      /*training=*/true, /*momentum=*/0.1, /*eps=*/1e-5,
                                      /*cudnn_enabled=*/false);
  if (c.residual) z = z + residual;
  ref.out.y = (c.relu ? torch::relu(z) : z).detach();
  const torch::Tensor mask = c.relu ? (f64(fused_y) > 0).to(torch::kDouble) : torch::ones_like(z);
  const torch::Tensor g = f64(in.dy) * mask;
  z.backward(g);
  ref.out.dx = x.grad();
  if (c.residual) ref.out.dresidual = residual.grad();
  ref.out.dweight = weight.grad();
  ref.out.dbias = bias.grad();
  // The batch's statistics as batch norm's training forward takes them (biased variance).
  const torch::Tensor mean = x.detach().mean({0, 2, 3}, /*keepdim=*/true);
  const torch::Tensor centred = x.detach() - mean;
  const torch::Tensor invstd =
      ((centred * centred).mean({0, 2, 3}, /*keepdim=*/true) + 1e-5).rsqrt();
  const torch::Tensor x_hat = centred * invstd;
  ref.dweight_terms = (g * x_hat).abs().sum({0, 2, 3});
  ref.dbias_terms = g.abs().sum({0, 2, 3});
  ref.xhat_rounding_terms = (g.abs() * (x.detach().abs() + mean.abs()) * invstd).sum({0, 2, 3});
  return ref;
}

// The worst |fused - ref| / tolerance of one output; > 1 fails.
double worst_ratio(const torch::Tensor& fused, const torch::Tensor& ref,
                   const torch::Tensor& tolerance) {
  return ((fused.to(torch::kDouble) - ref).abs() / tolerance).max().item<double>();
}

void expect_elementwise(const std::string& what, const Case& c, const torch::Tensor& fused,
                        const torch::Tensor& ref) {
  const double u = unit_roundoff(fused.scalar_type());
  const torch::Tensor tolerance = 2 * u * ref.abs() + 1e-4 * ref.abs().max() + 1e-300;
  const double ratio = worst_ratio(fused, ref, tolerance);
  EXPECT_LE(ratio, 1.0) << c.name() << ": " << what << " worst error/tolerance " << ratio;
}

// `rounding`: what the fp32 arithmetic adds to the sum's tolerance beyond its terms (dweight's).
void expect_sum(const std::string& what, const Case& c, const torch::Tensor& fused,
                const torch::Tensor& ref, const torch::Tensor& terms,
                const torch::Tensor& rounding = {}) {
  const double u = unit_roundoff(fused.scalar_type());
  torch::Tensor tolerance = 2 * u * ref.abs() + 1e-5 * terms + 1e-300;
  if (rounding.defined()) tolerance = tolerance + rounding;
  const double ratio = worst_ratio(fused, ref, tolerance);
  EXPECT_LE(ratio, 1.0) << c.name() << ": " << what << " worst error/tolerance " << ratio;
}

std::vector<Case> cases() {
  // Shapes: resnet18's on CIFAR at batch 256 (the case that matters: layer1, layer4); channels
  // that leave threads of a block idle (24, 160); one row per lane or fewer (rows 18); more
  // channels than one block's tile (4096 at 16 bits); few rows for many blocks' worth.
  const std::vector<std::vector<int64_t>> shapes = {
      {256, 64, 32, 32}, {256, 512, 4, 4}, {32, 160, 8, 8}, {5, 24, 3, 7},
      {2, 4096, 3, 3},   {7, 128, 1, 1},   {64, 16, 16, 16}};
  std::vector<Case> all;
  for (const auto& shape : shapes)
    for (c10::ScalarType dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16})
      for (int variant = 0; variant < 4; ++variant)
        all.push_back({shape, dtype, dtype, variant / 2 == 0, variant % 2 == 0});
  // fp32 parameters with 16-bit activations (LibTorch's mixed batch norm).
  all.push_back({{64, 64, 8, 8}, torch::kBFloat16, torch::kFloat, true, true});
  all.push_back({{64, 64, 8, 8}, torch::kHalf, torch::kFloat, true, false});
  return all;
}

TEST(FusedBatchNorm, MatchesLibTorchInFloat64) {
  torch::manual_seed(test_seed());
  for (const Case& c : cases()) {
    const Inputs in(c);
    const Outputs fused = run_fused(c, in);
    const Reference ref = run_reference(c, in, fused.y);
    expect_elementwise("y", c, fused.y, ref.out.y);
    expect_elementwise("dx", c, fused.dx, ref.out.dx);
    if (c.residual) expect_elementwise("dresidual", c, fused.dresidual, ref.out.dresidual);
    expect_sum("dweight", c, fused.dweight, ref.out.dweight, ref.dweight_terms,
               4 * unit_roundoff(torch::kFloat) * ref.xhat_rounding_terms);
    expect_sum("dbias", c, fused.dbias, ref.out.dbias, ref.dbias_terms);
    expect_elementwise("running_mean", c, fused.running_mean, ref.out.running_mean);
    expect_elementwise("running_var", c, fused.running_var, ref.out.running_var);
    EXPECT_TRUE(fused.y.is_contiguous(at::MemoryFormat::ChannelsLast)) << c.name();
    EXPECT_TRUE(fused.dx.is_contiguous(at::MemoryFormat::ChannelsLast)) << c.name();
  }
}

bool same_bits(const Outputs& a, const Outputs& b) {
  auto same = [](const torch::Tensor& p, const torch::Tensor& q) {
    return p.defined() == q.defined() && (!p.defined() || torch::equal(p, q));
  };
  return same(a.y, b.y) && same(a.dx, b.dx) && same(a.dresidual, b.dresidual) &&
         same(a.dweight, b.dweight) && same(a.dbias, b.dbias) &&
         same(a.running_mean, b.running_mean) && same(a.running_var, b.running_var);
}

TEST(FusedBatchNorm, SameInputsGiveTheSameBits) {
  torch::manual_seed(test_seed() + 1);
  const Case c{{256, 64, 32, 32}, torch::kBFloat16, torch::kBFloat16, true, true};
  const Inputs in(c);
  EXPECT_TRUE(same_bits(run_fused(c, in), run_fused(c, in)));
}

// Forward and backward captured in one CUDA graph, as the trainer's step is: a replay writes
// the eager run's bits, and the running statistics advance once per replay.
TEST(FusedBatchNorm, GraphReplayEqualsEager) {
  torch::manual_seed(test_seed() + 2);
  const Case c{{128, 128, 16, 16}, torch::kBFloat16, torch::kBFloat16, true, true};
  const Inputs in(c);
  const Outputs eager = run_fused(c, in);

  torch::nn::BatchNorm2d bn = batch_norm_for(in);
  const torch::Tensor x = in.x.clone().requires_grad_();
  const torch::Tensor residual = in.residual.clone().requires_grad_();
  auto step = [&] {
    const torch::Tensor y = batch_norm_act(x, *bn, residual, Activation::kRelu);
    const auto grads = torch::autograd::grad({y}, {x, residual, bn->weight, bn->bias}, {in.dy});
    return std::vector<torch::Tensor>{y, grads[0], grads[1], grads[2], grads[3]};
  };
  at::cuda::CUDAGraph graph;
  std::vector<torch::Tensor> captured;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  {
    const c10::cuda::CUDAStream capture_stream = c10::cuda::getStreamFromPool();
    const c10::cuda::CUDAStreamGuard guard(capture_stream);
    step();  // warm-up outside the capture, as the trainer's eager steps; reset below
    {
      torch::NoGradGuard no_grad;
      bn->running_mean.copy_(in.running_mean);
      bn->running_var.copy_(in.running_var);
      bn->num_batches_tracked.zero_();
    }
    graph.capture_begin();
    captured = step();
    graph.capture_end();
  }
  graph.replay();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Outputs replayed{captured[0], captured[1], captured[2], captured[3], captured[4],
                   bn->running_mean.clone(), bn->running_var.clone()};
  EXPECT_TRUE(same_bits(replayed, eager));
  EXPECT_EQ(bn->num_batches_tracked.item<double>(), 1.0);
}

// Where the kernels do not apply, batch_norm_act is LibTorch's ops: NCHW activations,
// evaluation, the switch off.
TEST(FusedBatchNorm, FallsBackToLibTorch) {
  const Case c{{8, 64, 4, 4}, torch::kBFloat16, torch::kBFloat16, true, false};
  const Inputs in(c);
  torch::nn::BatchNorm2d bn = batch_norm_for(in);
  EXPECT_TRUE(hpc_train::fused_batch_norm_applies(in.x, *bn, {}));
  EXPECT_FALSE(hpc_train::fused_batch_norm_applies(in.x.contiguous(), *bn, {}));  // NCHW
  EXPECT_FALSE(hpc_train::fused_batch_norm_applies(
      channels_last(torch::randn({8, 12, 4, 4}), torch::kBFloat16), *bn, {}));  // 12 % 8 != 0
  hpc_train::set_fused_batch_norm(false);
  EXPECT_FALSE(hpc_train::fused_batch_norm_applies(in.x, *bn, {}));
  hpc_train::set_fused_batch_norm(true);
  bn->eval();
  EXPECT_FALSE(hpc_train::fused_batch_norm_applies(in.x, *bn, {}));
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(batch_norm_act(in.x, *bn, {}, Activation::kRelu),
                           torch::relu(bn->forward(in.x))));
}

}  // namespace

// The fused pooling kernels on a GPU (GPU build only; pool_bias_relu.h, Note [Fused pooling]):
// relu(max_pool2d(x, 2) + bias) forward and backward against LibTorch's own max_pool2d, add and
// ReLU on the same GPU inputs in the same dtype (the switch off), for fp32, fp16 and bf16, over
// simple_cnn's shapes at batch 64 (28x28 and 14x14 maps, the pooled output NHWC and NCHW), an odd
// height and width and one to several channel vectors. The output and the input's gradient must
// be LibTorch's bits; the bias's gradient, a sum over batch and pixels that the two paths add
// in different orders, within 2u |ref| + 1e-5 sum |terms| (u: the dtype's unit roundoff, 2^-24,
// 2^-11, 2^-8). Inputs from a few values, so that windows tie, with NaN and -inf among them.
// Fresh random inputs every run (the seed is printed; HPC_TRAIN_TEST_SEED=<seed> repeats it).
// Also: a CUDA graph's replay of forward and backward gives the eager bits, and where the kernels
// do not apply LibTorch's ops run. test_kernel_items checks the same per-thread work on
// the CPU.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "hpc_train/model/pool_bias_relu.h"
#include "rounding.h"
#include "test_seed.h"

namespace {

using hpc_train::testing::unit_roundoff;

using hpc_train::max_pool_bias_relu;

uint64_t test_seed() { return hpc_train::testing::test_seed("test_fused_kernels"); }

const torch::Device kGpu(torch::kCUDA, 0);

struct Case {
  std::vector<int64_t> shape;  // N, C, H, W
  c10::ScalarType dtype;
  bool pooled_nchw;

  std::string name() const {
    char text[128];
    std::snprintf(text, sizeof text, "[%lld,%lld,%lld,%lld] %s, pooled %s",
                  static_cast<long long>(shape[0]), static_cast<long long>(shape[1]),
                  static_cast<long long>(shape[2]), static_cast<long long>(shape[3]),
                  c10::toString(dtype), pooled_nchw ? "NCHW" : "NHWC");
    return text;
  }
  at::MemoryFormat pooled_format() const {
    return pooled_nchw ? at::MemoryFormat::Contiguous : at::MemoryFormat::ChannelsLast;
  }
};

struct Inputs {
  torch::Tensor x, bias, dy;
};

Inputs draw(const Case& c) {
  torch::Tensor x = (torch::randint(-3, 4, c.shape) * 0.5).to(torch::kFloat);
  const torch::Tensor u = torch::rand(c.shape);
  x.masked_fill_(u < 0.03, std::numeric_limits<float>::quiet_NaN());
  x.masked_fill_((u >= 0.03) & (u < 0.06), -std::numeric_limits<float>::infinity());
  const int64_t channels = c.shape[1];
  Inputs in;
  in.x = x.to(kGpu, c.dtype).contiguous(at::MemoryFormat::ChannelsLast);
  in.bias = (torch::randint(-3, 4, {channels}) * 0.25).to(kGpu, c.dtype);
  in.dy = torch::randn({c.shape[0], channels, c.shape[2] / 2, c.shape[3] / 2})
              .to(kGpu, c.dtype)
              .contiguous(c.pooled_format());
  return in;
}

struct Outputs {
  torch::Tensor y, dx, dbias;
};

Outputs run(const Case& c, const Inputs& in, bool fused) {
  hpc_train::set_fused_pooling(fused);
  const torch::Tensor x = in.x.clone().requires_grad_();
  const torch::Tensor bias = in.bias.clone().requires_grad_();
  EXPECT_EQ(hpc_train::fused_pooling_applies(x, bias), fused) << c.name();
  const torch::Tensor y = max_pool_bias_relu(x, bias, c.pooled_format());
  const auto grads = torch::autograd::grad({y}, {x, bias}, {in.dy});
  hpc_train::set_fused_pooling(true);
  return {y.detach(), grads[0], grads[1]};
}

// Equal values, NaN where the other has NaN.
int64_t differing(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor fa = a.to(torch::kFloat), fb = b.to(torch::kFloat);
  return (~((fa == fb) | (torch::isnan(fa) & torch::isnan(fb)))).sum().item<int64_t>();
}

TEST(FusedPooling, EqualsLibTorch) {
  torch::manual_seed(test_seed());
  std::vector<Case> cases;
  for (const c10::ScalarType dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    const int64_t vector = dtype == torch::kFloat ? 4 : 8;
    cases.push_back({{64, 32, 28, 28}, dtype, false});  // simple_cnn's first pooling
    cases.push_back({{64, 64, 14, 14}, dtype, true});   // its second, before the flatten
    cases.push_back({{3, vector, 5, 7}, dtype, false});
    cases.push_back({{2, 3 * vector, 9, 6}, dtype, true});
    // The backward's blocks: 100 vectors (two pixels a block, 56 threads idle) and 256 (one).
    cases.push_back({{3, 100 * vector, 6, 4}, dtype, false});
    cases.push_back({{2, 256 * vector, 4, 2}, dtype, true});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name());
    const Inputs in = draw(c);
    const Outputs fused = run(c, in, true), reference = run(c, in, false);
    EXPECT_EQ(fused.y.suggest_memory_format(), c.pooled_format());
    EXPECT_EQ(differing(fused.y, reference.y), 0);
    EXPECT_EQ(differing(fused.dx, reference.dx), 0);
    // The bias's gradient: the masked dy summed over batch and pixels.
    const torch::Tensor masked = torch::where(reference.y.to(torch::kFloat) <= 0,
                                              torch::zeros({}, kGpu), in.dy.to(torch::kFloat));
    const torch::Tensor terms = masked.abs().sum({0, 2, 3}).to(torch::kDouble);
    const torch::Tensor ref = reference.dbias.to(torch::kDouble);
    const torch::Tensor bound = 2 * unit_roundoff(c.dtype) * ref.abs() + 1e-5 * terms;
    EXPECT_TRUE(((fused.dbias.to(torch::kDouble) - ref).abs() <= bound).all().item<bool>())
        << fused.dbias << ref;
  }
}

// Forward and backward captured in one CUDA graph, as the trainer's step is: a replay writes the
// eager run's bits.
TEST(FusedPooling, GraphReplayEqualsEager) {
  torch::manual_seed(test_seed() + 1);
  const Case c{{64, 32, 28, 28}, torch::kBFloat16, false};
  const Inputs in = draw(c);
  const Outputs eager = run(c, in, true);
  const torch::Tensor x = in.x.clone().requires_grad_();
  const torch::Tensor bias = in.bias.clone().requires_grad_();
  auto step = [&] {
    const torch::Tensor y = max_pool_bias_relu(x, bias, c.pooled_format());
    const auto grads = torch::autograd::grad({y}, {x, bias}, {in.dy});
    return std::vector<torch::Tensor>{y, grads[0], grads[1]};
  };
  at::cuda::CUDAGraph graph;
  std::vector<torch::Tensor> captured;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  {
    const c10::cuda::CUDAStream capture_stream = c10::cuda::getStreamFromPool();
    const c10::cuda::CUDAStreamGuard guard(capture_stream);
    step();  // warm-up outside the capture, as the trainer's eager steps
    graph.capture_begin();
    captured = step();
    graph.capture_end();
  }
  graph.replay();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(differing(captured[0], eager.y), 0);
  EXPECT_EQ(differing(captured[1], eager.dx), 0);
  EXPECT_EQ(differing(captured[2], eager.dbias), 0);
}

// Where the kernels do not apply, max_pool_bias_relu is LibTorch's ops: NCHW input, channels not
// a multiple of the vector or more than 256 vectors, a bias of another dtype, a CPU tensor, the
// switch off.
TEST(FusedPooling, FallsBackToLibTorch) {
  const Case c{{4, 16, 6, 6}, torch::kBFloat16, false};
  const Inputs in = draw(c);
  EXPECT_TRUE(hpc_train::fused_pooling_applies(in.x, in.bias));
  EXPECT_FALSE(hpc_train::fused_pooling_applies(in.x.contiguous(), in.bias));  // NCHW
  const torch::Tensor twelve =
      torch::randn({4, 12, 6, 6}, kGpu).to(torch::kBFloat16).contiguous(at::MemoryFormat::ChannelsLast);
  EXPECT_FALSE(hpc_train::fused_pooling_applies(twelve, in.bias.narrow(0, 0, 12)));  // 12 % 8
  // 257 vectors of 8: more than a backward block's threads hold for one pixel.
  const torch::Tensor wide = torch::randn({1, 257 * 8, 2, 2}, kGpu)
                                 .to(torch::kBFloat16)
                                 .contiguous(at::MemoryFormat::ChannelsLast);
  const torch::Tensor wide_bias = torch::zeros({257 * 8}, kGpu).to(torch::kBFloat16);
  EXPECT_FALSE(hpc_train::fused_pooling_applies(wide, wide_bias));
  EXPECT_TRUE(hpc_train::fused_pooling_applies(wide.narrow(1, 0, 256 * 8).contiguous(
                                                   at::MemoryFormat::ChannelsLast),
                                               wide_bias.narrow(0, 0, 256 * 8)));
  EXPECT_FALSE(hpc_train::fused_pooling_applies(in.x, in.bias.to(torch::kFloat)));
  EXPECT_FALSE(hpc_train::fused_pooling_applies(in.x.cpu(), in.bias.cpu()));
  hpc_train::set_fused_pooling(false);
  EXPECT_FALSE(hpc_train::fused_pooling_applies(in.x, in.bias));
  hpc_train::set_fused_pooling(true);
  const torch::Tensor x = in.x.contiguous().to(torch::kFloat);
  const torch::Tensor bias = in.bias.to(torch::kFloat);
  EXPECT_TRUE(torch::equal(max_pool_bias_relu(x.nan_to_num(), bias),
                           torch::relu(torch::max_pool2d(x.nan_to_num(), 2) + bias.view({1, -1, 1, 1}))));
}

}  // namespace

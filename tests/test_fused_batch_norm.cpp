// The fused batch-norm kernels on a GPU (GPU build only; batch_norm_act.h, Note [Fused batch
// norm]): relu(bn(x) + residual) forward and backward against LibTorch's own batch_norm, add and
// ReLU run in float64 on the same inputs, for fp32, fp16 and bf16 activations (parameters in the
// same dtype, and fp32 parameters with 16-bit activations), with and without the ReLU and the
// residual, over shapes that give the kernels' layout one channel tile or several, full or idle
// threads, many row blocks or one. Fresh random inputs every run (the seed is printed;
// HPC_TRAIN_TEST_SEED=<seed> repeats a run). Also: the same inputs give the same bits twice, and
// a CUDA graph's replay of forward and backward gives the eager bits. The reference and its
// tolerances: batch_norm_reference.h (Note [Fused batch norm tolerances]).
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

#include "batch_norm_reference.h"
#include "hpc_train/error.h"
#include "hpc_train/model/batch_norm_act.h"
#include "hpc_train/model/fused_batch_norm.h"
#include "test_seed.h"

namespace {

using hpc_train::Activation;
using hpc_train::batch_norm_act;
using namespace hpc_train::testing;

uint64_t test_seed() { return hpc_train::testing::test_seed("test_fused_batch_norm"); }

const torch::Device kGpu(torch::kCUDA, 0);

torch::Tensor channels_last(const torch::Tensor& t, c10::ScalarType dtype) {
  return t.to(kGpu, dtype).contiguous(at::MemoryFormat::ChannelsLast);
}

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
    const Inputs in(c, kGpu);
    const Outputs fused = run_fused(c, in);
    expect_matches_reference(c, in, fused);
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
  const Inputs in(c, kGpu);
  EXPECT_TRUE(same_bits(run_fused(c, in), run_fused(c, in)));
}

// Forward and backward captured in one CUDA graph, as the trainer's step is: a replay writes
// the eager run's bits, and the running statistics advance once per replay.
TEST(FusedBatchNorm, GraphReplayEqualsEager) {
  torch::manual_seed(test_seed() + 2);
  const Case c{{128, 128, 16, 16}, torch::kBFloat16, torch::kBFloat16, true, true};
  const Inputs in(c, kGpu);
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
  const Inputs in(c, kGpu);
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

// bench/bn_layout_sweep's layouts come from bn_layout with limits: out of their ranges it throws.
TEST(FusedBatchNorm, LayoutLimitsOutOfRangeThrow) {
  using hpc_train::BnLayoutLimits;
  const auto layout = [](const BnLayoutLimits& limits) {
    return hpc_train::bn_layout(4096, 64, hpc_train::KernelDtype::kBFloat16, limits);
  };
  EXPECT_EQ(layout({}).tile_vectors, 8);  // 64 channels: 8 vectors of 8
  EXPECT_EQ(layout({2, 16, 4}).tile_vectors, 2);
  EXPECT_THROW(layout({0, 16, 4}), hpc_train::Error);
  EXPECT_THROW(layout({257, 16, 4}), hpc_train::Error);
  EXPECT_THROW(layout({256, 0, 4}), hpc_train::Error);
  EXPECT_THROW(layout({256, 16, 0}), hpc_train::Error);
}

}  // namespace

// The cross-entropy kernels on a GPU (GPU build only; cross_entropy.h, Note [Fused
// cross-entropy]): the loss and the logits' gradient against LibTorch's cross_entropy on the
// same GPU logits in fp64, for fp32, fp16 and bf16 logits, a micro-batch of the zoo's ten
// classes and a thousand classes over more rows than the forward's block has threads. Bounds as
// in test_cross_entropy_items.cpp (e = (classes + 16) 2^-24; the mean adds the rows' fp32 sum):
//   loss        |fused - ref| <= (e + rows 2^-24) (1 + |ref|)
//   gradient    |fused - ref| <= 2u |ref| + s + e grad / rows   (s: fp16's subnormals, 2^-25)
// Label smoothing against LibTorch's cross_entropy(label_smoothing) in fp64, with the same
// bounds. Also: the same inputs give the same bits, a CUDA graph's replay gives the eager bits, and
// where the kernels do not apply LibTorch's ops run.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "hpc_train/train/cross_entropy.h"
#include "rounding.h"
#include "test_seed.h"

namespace {

using hpc_train::testing::unit_roundoff;
using hpc_train::testing::subnormal_rounding;

const torch::Device kGpu(torch::kCUDA, 0);

struct Result {
  torch::Tensor loss, grad;
};

Result fused(const torch::Tensor& logits_in, const torch::Tensor& labels, double grad_loss,
             double label_smoothing = 0.0) {
  const torch::Tensor logits = logits_in.clone().requires_grad_(true);
  EXPECT_TRUE(hpc_train::fused_cross_entropy_applies(logits, labels));
  const torch::Tensor loss = hpc_train::mean_cross_entropy(logits, labels, label_smoothing);
  return {loss.detach(), torch::autograd::grad({loss * grad_loss}, {logits})[0]};
}

TEST(FusedCrossEntropy, AgreesWithLibTorch) {
  torch::manual_seed(static_cast<int64_t>(hpc_train::testing::test_seed("test_fused_kernels")) + 20);
  struct Case {
    int64_t rows, classes;
    c10::ScalarType dtype;
    double smoothing;
  };
  const std::vector<Case> cases = {
      {64, 10, torch::kFloat, 0.0},       {64, 10, torch::kHalf, 0.0},
      {64, 10, torch::kBFloat16, 0.0},    {256, 10, torch::kBFloat16, 0.0},
      {600, 1000, torch::kFloat, 0.0},    {600, 1000, torch::kBFloat16, 0.0},
      {64, 10, torch::kFloat, 0.1},       {256, 10, torch::kBFloat16, 0.1},
      {600, 1000, torch::kFloat, 0.2}};
  const double grad_loss = 0.75;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.rows) + " x " + std::to_string(c.classes) + " " +
                 c10::toString(c.dtype) + ", smoothing " + std::to_string(c.smoothing));
    const torch::Tensor logits = (torch::randn({c.rows, c.classes}, kGpu) * 3).to(c.dtype);
    const torch::Tensor labels = torch::randint(0, c.classes, {c.rows}, torch::TensorOptions(kGpu).dtype(torch::kLong));
    const Result got = fused(logits, labels, grad_loss, c.smoothing);
    EXPECT_EQ(got.loss.scalar_type(), torch::kFloat);
    EXPECT_EQ(got.grad.scalar_type(), c.dtype);
    const torch::Tensor x = logits.to(torch::kDouble).requires_grad_(true);
    const torch::Tensor loss = torch::nn::functional::cross_entropy(
        x, labels, torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(c.smoothing));
    const torch::Tensor grad = torch::autograd::grad({loss * grad_loss}, {x})[0];
    const double e = static_cast<double>(c.classes + 16) * 0x1p-24;
    const double ref = loss.item<double>();
    EXPECT_LE(std::abs(got.loss.item<double>() - ref),
              (e + static_cast<double>(c.rows) * 0x1p-24) * (1 + std::abs(ref)));
    const torch::Tensor error = (got.grad.to(torch::kDouble) - grad).abs();
    const torch::Tensor bound = 2 * unit_roundoff(c.dtype) * grad.abs() +
                                subnormal_rounding(c.dtype) +
                                e * grad_loss / static_cast<double>(c.rows);
    EXPECT_TRUE((error <= bound).all().item<bool>()) << "largest error " << error.max().item<double>();
  }
}

// The same inputs give the same bits, eagerly and from a CUDA graph's replay (as the trainer's
// captured step runs it).
TEST(FusedCrossEntropy, RepeatsAndReplaysBitForBit) {
  torch::manual_seed(static_cast<int64_t>(hpc_train::testing::test_seed("test_fused_kernels")) + 21);
  const torch::Tensor logits = torch::randn({64, 10}, kGpu).to(torch::kBFloat16);
  const torch::Tensor labels = torch::randint(0, 10, {64}, torch::TensorOptions(kGpu).dtype(torch::kLong));
  const Result first = fused(logits, labels, 1.0), second = fused(logits, labels, 1.0);
  EXPECT_TRUE(torch::equal(first.loss, second.loss));
  EXPECT_TRUE(torch::equal(first.grad, second.grad));

  const torch::Tensor x = logits.clone().requires_grad_(true);
  auto step = [&] {
    const torch::Tensor loss = hpc_train::mean_cross_entropy(x, labels);
    return std::vector<torch::Tensor>{loss, torch::autograd::grad({loss}, {x})[0]};
  };
  at::cuda::CUDAGraph graph;
  std::vector<torch::Tensor> captured;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  {
    const c10::cuda::CUDAStream capture_stream = c10::cuda::getStreamFromPool();
    const c10::cuda::CUDAStreamGuard guard(capture_stream);
    step();
    graph.capture_begin();
    captured = step();
    graph.capture_end();
  }
  graph.replay();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(torch::equal(captured[0], first.loss));
  EXPECT_TRUE(torch::equal(captured[1], first.grad));
}

// Where the kernels do not apply, mean_cross_entropy is LibTorch's cross_entropy in fp32.
TEST(FusedCrossEntropy, FallsBackToLibTorch) {
  const torch::Tensor logits = torch::randn({8, 10}, kGpu);
  const torch::Tensor labels = torch::randint(0, 10, {8}, torch::TensorOptions(kGpu).dtype(torch::kLong));
  EXPECT_TRUE(hpc_train::fused_cross_entropy_applies(logits, labels));
  const torch::Tensor column_major = logits.t().contiguous().t();  // [8, 10], not contiguous
  EXPECT_FALSE(hpc_train::fused_cross_entropy_applies(column_major, labels));
  EXPECT_FALSE(hpc_train::fused_cross_entropy_applies(logits, labels.narrow(0, 0, 7)));
  EXPECT_FALSE(hpc_train::fused_cross_entropy_applies(logits, labels.to(torch::kInt)));
  EXPECT_FALSE(hpc_train::fused_cross_entropy_applies(logits.cpu(), labels.cpu()));
  EXPECT_FALSE(hpc_train::fused_cross_entropy_applies(logits.to(torch::kDouble), labels));
  const torch::Tensor cpu_logits = logits.cpu();
  EXPECT_TRUE(torch::equal(hpc_train::mean_cross_entropy(cpu_logits, labels.cpu()),
                           torch::nn::functional::cross_entropy(cpu_logits, labels.cpu())));
}

}  // namespace

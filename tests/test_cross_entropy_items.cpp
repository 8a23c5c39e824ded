// The cross-entropy kernels' per-thread work (cross_entropy_items.h; Note [Fused cross-entropy]
// in cross_entropy.h), run on the CPU over every row and element, against LibTorch's log_softmax
// and nll_loss and their gradient in fp64 on the same dtype values, for fp32, fp16 and bf16
// logits, ten classes (the zoo's) to a thousand, and one. With u the logits dtype's unit
// roundoff (2^-24, 2^-11, 2^-8) and e = (classes + 16) 2^-24 (fp32's exp, log and a sum over the
// classes):
//   a row's loss            |item - ref| <= e (1 + |ref|)
//   a gradient element      |item - ref| <= 2u |ref| + s + e grad / rows
// (s: half the spacing of the dtype's subnormals, 2^-25 for fp16, where small gradients fall).
// A wrong term (the one-hot at another class, a missing 1/rows, a label read from another row)
// is off by far more. Label smoothing against LibTorch's cross_entropy(label_smoothing) written
// out in fp64. A label outside the classes gives NaN, not a read out of bounds. Fresh
// random inputs every run (the seed is printed; HPC_TRAIN_TEST_SEED=<seed> repeats a run).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "hpc_train/train/cross_entropy.h"
#include "hpc_train/train/cross_entropy_items.h"
#include "host_convert.h"
#include "rounding.h"
#include "test_seed.h"

namespace {

using hpc_train::testing::unit_roundoff;
using hpc_train::testing::subnormal_rounding;

using hpc_train::testing::HostConvert;
using hpc_train::CrossEntropyShape;

template <typename T>
void check_case(c10::ScalarType dtype, int64_t rows, int64_t classes, float smoothing = 0.0f) {
  SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(classes) + " " +
               c10::toString(dtype) + ", smoothing " + std::to_string(smoothing));
  const torch::Tensor logits = (torch::randn({rows, classes}) * 3).to(dtype);
  const torch::Tensor labels = torch::randint(0, classes, {rows}, torch::kLong);
  const CrossEntropyShape s{rows, classes, smoothing};
  torch::Tensor row_loss = torch::empty({rows}), lse = torch::empty({rows});
  for (int64_t r = 0; r < rows; ++r)
    row_loss[r] = hpc_train::cross_entropy_row<T, HostConvert>(
        s, logits.data_ptr<T>(), labels.data_ptr<int64_t>(), r, lse.data_ptr<float>() + r);
  const float grad_loss = 0.75f;
  torch::Tensor grad = torch::empty_like(logits);
  for (int64_t e = 0; e < rows * classes; ++e)
    hpc_train::cross_entropy_grad_element<T, HostConvert>(
        s, logits.data_ptr<T>(), labels.data_ptr<int64_t>(), lse.data_ptr<float>(), &grad_loss,
        e, grad.data_ptr<T>());

  const torch::Tensor x = logits.to(torch::kDouble).requires_grad_(true);
  const torch::Tensor log_softmax = torch::log_softmax(x, 1);
  const torch::Tensor nll_rows = -log_softmax.gather(1, labels.view({-1, 1})).squeeze(1);
  const torch::Tensor expected_rows =
      (1.0 - smoothing) * nll_rows + static_cast<double>(smoothing) * -log_softmax.mean(1);
  const double e = static_cast<double>(classes + 16) * 0x1p-24;
  const torch::Tensor loss_error = (row_loss.to(torch::kDouble) - expected_rows).abs();
  EXPECT_TRUE((loss_error <= e * (1 + expected_rows.abs())).all().item<bool>())
      << "largest loss error " << loss_error.max().item<double>();
  const torch::Tensor mean = torch::nn::functional::cross_entropy(
      x, labels,
      torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(static_cast<double>(smoothing)));
  EXPECT_NEAR(mean.item<double>(), expected_rows.mean().item<double>(), 1e-12);
  const torch::Tensor expected_grad = torch::autograd::grad({mean * grad_loss}, {x})[0];
  const torch::Tensor grad_error = (grad.to(torch::kDouble) - expected_grad).abs();
  const torch::Tensor bound =
      2 * unit_roundoff(dtype) * expected_grad.abs() + subnormal_rounding(dtype) +
      e * grad_loss / static_cast<double>(rows);
  EXPECT_TRUE((grad_error <= bound).all().item<bool>())
      << "largest gradient error " << grad_error.max().item<double>();
}

TEST(CrossEntropyItems, AgreeWithLibTorch) {
  torch::manual_seed(static_cast<int64_t>(hpc_train::testing::test_seed("test_kernel_items")) + 10);
  check_case<float>(torch::kFloat, 64, 10);
  check_case<float>(torch::kFloat, 3, 1000);
  check_case<float>(torch::kFloat, 5, 1);
  check_case<c10::Half>(torch::kHalf, 64, 10);
  check_case<c10::BFloat16>(torch::kBFloat16, 64, 10);
  check_case<c10::BFloat16>(torch::kBFloat16, 7, 1000);
}

TEST(CrossEntropyItems, LabelSmoothingAgreesWithLibTorch) {
  torch::manual_seed(static_cast<int64_t>(hpc_train::testing::test_seed("test_kernel_items")) + 20);
  check_case<float>(torch::kFloat, 64, 10, 0.1f);
  check_case<float>(torch::kFloat, 3, 1000, 0.3f);
  check_case<c10::Half>(torch::kHalf, 64, 10, 0.1f);
  check_case<c10::BFloat16>(torch::kBFloat16, 7, 1000, 0.2f);
}

TEST(CrossEntropyItems, ALabelOutsideTheClassesGivesNaN) {
  const torch::Tensor logits = torch::randn({2, 4});
  const torch::Tensor labels = torch::tensor(std::vector<int64_t>{1, 4});
  const CrossEntropyShape s{2, 4};
  float lse[2];
  EXPECT_FALSE(std::isnan(hpc_train::cross_entropy_row<float, HostConvert>(
      s, logits.data_ptr<float>(), labels.data_ptr<int64_t>(), 0, &lse[0])));
  EXPECT_TRUE(std::isnan(hpc_train::cross_entropy_row<float, HostConvert>(
      s, logits.data_ptr<float>(), labels.data_ptr<int64_t>(), 1, &lse[1])));
  const float grad_loss = 1.0f;
  float grad[8] = {};
  for (int64_t e = 0; e < 8; ++e)
    hpc_train::cross_entropy_grad_element<float, HostConvert>(
        s, logits.data_ptr<float>(), labels.data_ptr<int64_t>(), lse, &grad_loss, e, grad);
  for (int64_t e = 0; e < 4; ++e) EXPECT_FALSE(std::isnan(grad[e])) << e;
  for (int64_t e = 4; e < 8; ++e) EXPECT_TRUE(std::isnan(grad[e])) << e;
}

// Where no kernel runs (a CPU tensor here), mean_cross_entropy is LibTorch's cross_entropy on
// the logits in fp32, gradient included.
TEST(CrossEntropyItems, LibTorchOpsWhereTheKernelsDoNotApply) {
  const torch::Tensor logits = torch::randn({8, 10}).to(torch::kBFloat16).requires_grad_(true);
  const torch::Tensor labels = torch::randint(0, 10, {8}, torch::kLong);
  EXPECT_FALSE(hpc_train::fused_cross_entropy_applies(logits, labels));
  const torch::Tensor loss = hpc_train::mean_cross_entropy(logits, labels);
  const torch::Tensor expected =
      torch::nn::functional::cross_entropy(logits.to(torch::kFloat), labels);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(loss, expected));
  EXPECT_TRUE(torch::equal(torch::autograd::grad({loss}, {logits})[0],
                           torch::autograd::grad({expected}, {logits})[0]));
}

}  // namespace

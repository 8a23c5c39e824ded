// The fused pooling kernels' per-thread work (fused_pooling_items.h; Note [Fused pooling] in
// pool_bias_relu.h), run on the CPU over every item, against LibTorch: forward against
// relu(max_pool2d(x, 2) + bias) and max_pool2d's own indices, backward against autograd
// through max_pool2d with the ReLU's mask (LibTorch's threshold_backward: the gradient passes
// where y > 0 or y is NaN). Every value must be equal, not close: the items compute what LibTorch
// computes. fp32, fp16 and bf16; inputs drawn from a few values, so that windows tie, with NaN
// and -inf among them; odd heights and widths (the last row or column not pooled); the pooled
// output NHWC and NCHW; one to three channel vectors. Fresh random inputs every run (the seed is
// printed; HPC_TRAIN_TEST_SEED=<seed> repeats a run). The GPU build's test_fused_kernels runs
// the kernels themselves.
//
// The reference computes in fp32 from the dtype's values and rounds once at the end: LibTorch's
// add in fp16 or bf16 does the same (one fp32 sum, rounded), and rounding does not change a
// value's sign, so the ReLU before or after it gives the same bits.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "hpc_train/model/fused_pooling_items.h"
#include "hpc_train/model/pool_bias_relu.h"
#include "host_convert.h"
#include "test_seed.h"

namespace {

using hpc_train::testing::HostConvert;
using hpc_train::PoolShape;


struct Case {
  std::vector<int64_t> shape;  // N, C, H, W
  bool pooled_nchw;

  std::string name(c10::ScalarType dtype) const {
    char text[128];
    std::snprintf(text, sizeof text, "[%lld,%lld,%lld,%lld] %s, pooled %s",
                  static_cast<long long>(shape[0]), static_cast<long long>(shape[1]),
                  static_cast<long long>(shape[2]), static_cast<long long>(shape[3]),
                  c10::toString(dtype), pooled_nchw ? "NCHW" : "NHWC");
    return text;
  }
};

// Equal values, NaN where the other has NaN (-0 and +0 count as equal).
void expect_same_values(const torch::Tensor& actual, const torch::Tensor& expected,
                        const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const torch::Tensor a = actual.to(torch::kFloat), e = expected.to(torch::kFloat);
  const torch::Tensor same = (a == e) | (torch::isnan(a) & torch::isnan(e));
  const int64_t differing = (~same).sum().item<int64_t>();
  EXPECT_EQ(differing, 0) << what << ": " << differing << " of " << a.numel()
                          << " elements differ";
}

PoolShape shape_of(const torch::Tensor& x, const torch::Tensor& pooled) {
  PoolShape s;
  s.batch = x.size(0);
  s.channels = x.size(1);
  s.height = x.size(2);
  s.width = x.size(3);
  s.pooled_height = pooled.size(2);
  s.pooled_width = pooled.size(3);
  s.out_stride_n = pooled.stride(0);
  s.out_stride_c = pooled.stride(1);
  s.out_stride_h = pooled.stride(2);
  s.out_stride_w = pooled.stride(3);
  return s;
}

// Values -1.5 .. 1.5 in steps of 0.5 (ties in most windows), about 3% NaN and 3% -inf, and the
// first window of every channel all -inf (its argmax is the window's first pixel).
torch::Tensor draw_input(const std::vector<int64_t>& shape) {
  torch::Tensor x = (torch::randint(-3, 4, shape) * 0.5).to(torch::kFloat);
  const torch::Tensor u = torch::rand(shape);
  x.masked_fill_(u < 0.03, std::numeric_limits<float>::quiet_NaN());
  x.masked_fill_((u >= 0.03) & (u < 0.06), -std::numeric_limits<float>::infinity());
  x.index_put_({0, torch::indexing::Slice(), torch::indexing::Slice(0, 2),
                torch::indexing::Slice(0, 2)},
               -std::numeric_limits<float>::infinity());
  return x;
}

template <typename T>
void check_case(c10::ScalarType dtype, const Case& c) {
  SCOPED_TRACE(c.name(dtype));
  const auto nhwc = at::MemoryFormat::ChannelsLast;
  const at::MemoryFormat pooled_format = c.pooled_nchw ? at::MemoryFormat::Contiguous : nhwc;
  const int64_t n = c.shape[0], channels = c.shape[1];
  const int64_t pooled_h = c.shape[2] / 2, pooled_w = c.shape[3] / 2;
  const std::vector<int64_t> pooled_shape = {n, channels, pooled_h, pooled_w};
  const torch::Tensor x = draw_input(c.shape).to(dtype).contiguous(nhwc);
  const torch::Tensor bias = (torch::randint(-3, 4, {channels}) * 0.25).to(dtype);
  const torch::Tensor dy = torch::randn(pooled_shape).to(dtype).contiguous(pooled_format);

  // The items, over every item.
  torch::Tensor y = torch::empty(pooled_shape, torch::TensorOptions(dtype).memory_format(pooled_format));
  torch::Tensor window_index = torch::empty({y.numel()}, torch::kUInt8);
  const PoolShape s = shape_of(x, y);
  const int64_t items = hpc_train::pool_items<T>(s);
  ASSERT_EQ(items * hpc_train::kPoolVectorElements<T>, y.numel());
  for (int64_t item = 0; item < items; ++item)
    hpc_train::pool_bias_relu_forward_item<T, HostConvert>(
        s, item, x.data_ptr<T>(), bias.data_ptr<T>(), y.data_ptr<T>(),
        window_index.data_ptr<uint8_t>());
  // (torch::zeros would drop the memory format.)
  torch::Tensor dx = torch::empty(c.shape, torch::TensorOptions(dtype).memory_format(nhwc)).zero_();
  // Each item's terms of the bias's gradient, put where its pixel and channels are.
  constexpr int V = hpc_train::kPoolVectorElements<T>;
  torch::Tensor bias_terms = torch::empty(pooled_shape, torch::TensorOptions(torch::kFloat).memory_format(nhwc));
  for (int64_t item = 0; item < items; ++item) {
    float terms[V];
    hpc_train::pool_bias_relu_backward_item<T, HostConvert>(
        s, item, dy.data_ptr<T>(), y.data_ptr<T>(), window_index.data_ptr<uint8_t>(),
        dx.data_ptr<T>(), terms);
    const hpc_train::PoolItemPlace p = hpc_train::pool_item_place<T>(s, item);
    for (int i = 0; i < V; ++i) bias_terms.data_ptr<float>()[p.pixel * channels + p.c + i] = terms[i];
  }

  // LibTorch.
  const torch::Tensor x_float = x.to(torch::kFloat).contiguous().requires_grad_(true);
  const auto [pooled, indices] = torch::max_pool2d_with_indices(x_float, 2);
  const torch::Tensor expected_y =
      torch::relu(pooled + bias.to(torch::kFloat).view({1, -1, 1, 1})).to(dtype);
  expect_same_values(y, expected_y, "y");
  // The items' argmax as an index into the input's plane, max_pool2d's convention.
  const torch::Tensor k = window_index.view({n, pooled_h, pooled_w, channels})
                              .permute({0, 3, 1, 2})
                              .to(torch::kLong);
  const torch::Tensor rows = torch::arange(pooled_h).view({1, 1, -1, 1}) * 2 + k.div(2, "floor");
  const torch::Tensor cols = torch::arange(pooled_w).view({1, 1, 1, -1}) * 2 + k.remainder(2);
  expect_same_values(rows * c.shape[3] + cols, indices, "argmax");

  const torch::Tensor masked = torch::where(y.to(torch::kFloat) <= 0, torch::zeros({}),
                                            dy.to(torch::kFloat));
  expect_same_values(bias_terms, masked.to(dtype).to(torch::kFloat), "bias terms");
  const torch::Tensor expected_dx = torch::autograd::grad({pooled}, {x_float}, {masked})[0];
  expect_same_values(dx, expected_dx.to(dtype), "dx");

}

const std::vector<Case> cases_for(int64_t vector) {
  return {{{2, vector, 6, 4}, false},      {{2, vector, 6, 4}, true},
          {{3, 2 * vector, 5, 7}, false},  {{3, 2 * vector, 5, 7}, true},
          {{1, 3 * vector, 2, 2}, false},  {{2, 3 * vector, 3, 9}, true},
          {{2, 2 * vector, 28, 28}, false}, {{2, 2 * vector, 14, 14}, true}};
}

TEST(FusedPoolingItems, EqualLibTorchFp32) {
  torch::manual_seed(static_cast<int64_t>(hpc_train::testing::test_seed("test_kernel_items")));
  for (const Case& c : cases_for(4)) check_case<float>(torch::kFloat, c);
}

TEST(FusedPoolingItems, EqualLibTorchFp16) {
  torch::manual_seed(static_cast<int64_t>(hpc_train::testing::test_seed("test_kernel_items")) + 1);
  for (const Case& c : cases_for(8)) check_case<c10::Half>(torch::kHalf, c);
}

TEST(FusedPoolingItems, EqualLibTorchBf16) {
  torch::manual_seed(static_cast<int64_t>(hpc_train::testing::test_seed("test_kernel_items")) + 2);
  for (const Case& c : cases_for(8)) check_case<c10::BFloat16>(torch::kBFloat16, c);
}

// Where no kernel runs (a CPU tensor here), max_pool_bias_relu is LibTorch's ops, gradients
// included.
TEST(FusedPoolingItems, LibTorchOpsWhereTheKernelsDoNotApply) {
  const torch::Tensor x = torch::randn({2, 8, 6, 6}).requires_grad_(true);
  const torch::Tensor bias = torch::randn({8}).requires_grad_(true);
  EXPECT_FALSE(hpc_train::fused_pooling_applies(x, bias));
  const torch::Tensor y = hpc_train::max_pool_bias_relu(x, bias);
  const torch::Tensor expected = torch::relu(torch::max_pool2d(x, 2) + bias.view({1, -1, 1, 1}));
  EXPECT_TRUE(torch::equal(y, expected));
  const auto grads = torch::autograd::grad({y.sum()}, {x, bias});
  const auto expected_grads = torch::autograd::grad({expected.sum()}, {x, bias});
  EXPECT_TRUE(torch::equal(grads[0], expected_grads[0]));
  EXPECT_TRUE(torch::equal(grads[1], expected_grads[1]));
}

}  // namespace

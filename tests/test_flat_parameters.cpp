// Flat storage: parameters and gradients are views of two buffers laid out by buckets (padding
// included), backward fills them, and the logical layout survives a re-layout.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hpc_train/model/flat_parameters.h"

namespace {

hpc_train::BucketLayout layout_of(const std::vector<std::vector<int>>& groups,
                                  const std::vector<int64_t>& numels, int world) {
  std::vector<hpc_train::Bucket> buckets;
  for (const auto& group : groups) {
    hpc_train::Bucket bucket;
    bucket.parameters = group;
    buckets.push_back(bucket);
  }
  return hpc_train::make_bucket_layout(buckets, numels, world);
}

}  // namespace

TEST(FlatParameters, BackwardWritesIntoTheFlatGradientBuffer) {
  torch::manual_seed(1);
  torch::nn::Linear layer(3, 2);  // weight [2,3] (6) then bias [2] (2)
  std::vector<std::string> names;
  std::vector<at::Tensor> parameters;
  for (const auto& item : layer->named_parameters()) {
    names.push_back(item.key());
    parameters.push_back(item.value());
  }
  const torch::Tensor weight_before = layer->weight.detach().clone();
  // Bias first, then weight, world size 3: bias 2 -> padded to 48 (3 x 16); weight 6 -> 48.
  hpc_train::FlatParameters flat(names, parameters, layout_of({{1}, {0}}, {6, 2}, 3));
  ASSERT_EQ(flat.numel(), 8);
  ASSERT_EQ(flat.values().numel(), 96);
  EXPECT_EQ(flat.layout().slots[0].offset, 48);
  // Values moved, not changed; the module now reads the flat buffer.
  EXPECT_TRUE(torch::equal(layer->weight.detach(), weight_before));
  flat.values().narrow(0, 0, 2).fill_(5.0f);
  EXPECT_TRUE(torch::equal(layer->bias.detach(), torch::full({2}, 5.0f)));

  const torch::Tensor x = torch::ones({4, 3});
  layer->forward(x).sum().backward();
  // d(sum)/d(bias) = batch size; d(sum)/d(weight) = sum of inputs = 4; padding stays 0.
  const torch::Tensor expected = torch::cat({torch::full({2}, 4.f), torch::zeros({46}),
                                             torch::full({6}, 4.f), torch::zeros({42})});
  EXPECT_TRUE(torch::equal(flat.grads(), expected));
  layer->forward(x).sum().backward();  // accumulates in place
  EXPECT_TRUE(torch::equal(flat.grads(), expected * 2));
  flat.zero_grads();
  EXPECT_TRUE(torch::equal(layer->weight.grad(), torch::zeros({2, 3})));
}

TEST(FlatParameters, RelayoutKeepsTheLogicalValues) {
  std::vector<at::Tensor> parameters = {torch::arange(5, torch::kFloat).requires_grad_(),
                                        torch::arange(10, 13, torch::kFloat).requires_grad_()};
  hpc_train::FlatParameters flat({"a", "b"}, parameters, layout_of({{1, 0}}, {5, 3}, 2));
  const torch::Tensor logical = flat.to_logical(flat.values());
  EXPECT_TRUE(torch::equal(logical, torch::tensor({0.f, 1.f, 2.f, 3.f, 4.f, 10.f, 11.f, 12.f})));
  flat.relayout(layout_of({{0}, {1}}, {5, 3}, 4));
  EXPECT_EQ(flat.values().numel(), 128);  // 5 -> 64 (4 x 16), 3 -> 64
  EXPECT_TRUE(torch::equal(flat.to_logical(flat.values()), logical));
  EXPECT_TRUE(torch::equal(parameters[1].detach(), torch::tensor({10.f, 11.f, 12.f})));
  EXPECT_TRUE(torch::equal(flat.from_logical(logical), flat.values()));
}

// Note [Channels-last weights]: a convolution's weight is stored [O, kH, kW, I] and seen
// channels-last, its gradient too; values, gradients and the logical layout are the same as
// with contiguous storage (the convolution of a copy of the module, stored as LibTorch made it).
TEST(FlatParameters, ChannelsLastWeightsKeepValuesGradientsAndLogicalOrder) {
  torch::manual_seed(2);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 4, 3).padding(1));  // weight [4,3,3,3]
  torch::nn::Conv2d reference(torch::nn::Conv2dOptions(3, 4, 3).padding(1));
  {
    torch::NoGradGuard no_grad;
    reference->weight.copy_(conv->weight);
    reference->bias.copy_(conv->bias);
  }
  std::vector<std::string> names;
  std::vector<at::Tensor> parameters;
  for (const auto& item : conv->named_parameters()) {
    names.push_back(item.key());
    parameters.push_back(item.value());
  }
  const torch::Tensor logical_before =
      torch::cat({conv->weight.detach().reshape({-1}), conv->bias.detach()});
  hpc_train::FlatParameters flat(names, parameters, layout_of({{1, 0}}, {108, 4}, 2),
                                 /*channels_last_weights=*/true);
  EXPECT_TRUE(conv->weight.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_FALSE(conv->weight.is_contiguous());
  EXPECT_TRUE(conv->bias.is_contiguous());  // not 4-D: as before
  EXPECT_TRUE(torch::equal(conv->weight.detach(), reference->weight.detach()));
  EXPECT_EQ(conv->weight.grad().strides(), conv->weight.strides());
  // The slot holds [O, kH, kW, I]: element (o=1, i=2, h=0, w=1) sits at 1*27 + 0*9 + 1*3 + 2.
  const int64_t weight_offset = flat.layout().slots[0].offset;
  EXPECT_EQ(flat.values()[weight_offset + 27 + 3 + 2].item<float>(),
            reference->weight[1][2][0][1].item<float>());
  const torch::Tensor logical = flat.to_logical(flat.values());
  EXPECT_TRUE(torch::equal(logical, logical_before));
  EXPECT_TRUE(torch::equal(flat.from_logical(logical), flat.values()));

  const torch::Tensor x = torch::randn({2, 3, 5, 5}).contiguous(at::MemoryFormat::ChannelsLast);
  for (int pass = 0; pass < 2; ++pass) {  // the second accumulates in place
    conv->forward(x).square().sum().backward();
    reference->forward(x).square().sum().backward();
  }
  EXPECT_TRUE(torch::allclose(conv->weight.grad(), reference->weight.grad(), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(conv->bias.grad(), reference->bias.grad(), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(flat.to_logical(flat.grads()),
                              torch::cat({reference->weight.grad().reshape({-1}),
                                          reference->bias.grad()}),
                              1e-5, 1e-5));
  flat.relayout(layout_of({{0}, {1}}, {108, 4}, 3));  // the logical order survives a re-layout
  EXPECT_TRUE(torch::equal(flat.to_logical(flat.values()), logical_before));
  EXPECT_TRUE(conv->weight.is_contiguous(at::MemoryFormat::ChannelsLast));
}

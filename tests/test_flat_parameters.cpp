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

// Flat storage: parameters and gradients are views of two buffers, and backward fills them.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hpc_train/flat_parameters.h"

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
  hpc_train::FlatParameters flat(names, parameters);
  ASSERT_EQ(flat.numel(), 8);
  EXPECT_EQ(flat.slots()[1].name, "bias");
  EXPECT_EQ(flat.slots()[1].offset, 6);
  // Values moved, not changed; the module now reads the flat buffer.
  EXPECT_TRUE(torch::equal(layer->weight.detach(), weight_before));
  flat.values().narrow(0, 6, 2).fill_(5.0f);
  EXPECT_TRUE(torch::equal(layer->bias.detach(), torch::full({2}, 5.0f)));

  const torch::Tensor x = torch::ones({4, 3});
  layer->forward(x).sum().backward();
  // d(sum)/d(bias) = batch size; d(sum)/d(weight) = sum of inputs = 4.
  EXPECT_TRUE(torch::equal(flat.grads(), torch::full({8}, 4.0f)));
  layer->forward(x).sum().backward();  // accumulates in place
  EXPECT_TRUE(torch::equal(flat.grads(), torch::full({8}, 8.0f)));
  flat.zero_grads();
  EXPECT_TRUE(torch::equal(layer->weight.grad(), torch::zeros({2, 3})));
}

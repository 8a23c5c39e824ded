// adam_update against LibTorch's own Adam and AdamW on the same parameters and gradients.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hpc_train/error.h"
#include "hpc_train/optim/optimizer.h"

namespace {

void compare_with_libtorch(bool decoupled) {
  torch::manual_seed(7);
  const int64_t n = 1000;
  torch::Tensor reference = torch::randn({n}, torch::kFloat).requires_grad_(true);
  torch::Tensor ours = reference.detach().clone();
  const hpc_train::AdamOptions options{3e-3, 0.9, 0.99, 1e-8, 0.05, decoupled};
  torch::Tensor exp_avg = torch::zeros_like(ours), exp_avg_sq = torch::zeros_like(ours);
  std::unique_ptr<torch::optim::Optimizer> libtorch;
  if (decoupled)
    libtorch = std::make_unique<torch::optim::AdamW>(
        std::vector<torch::Tensor>{reference},
        torch::optim::AdamWOptions(3e-3).betas({0.9, 0.99}).eps(1e-8).weight_decay(0.05));
  else
    libtorch = std::make_unique<torch::optim::Adam>(
        std::vector<torch::Tensor>{reference},
        torch::optim::AdamOptions(3e-3).betas({0.9, 0.99}).eps(1e-8).weight_decay(0.05));
  for (int step = 0; step < 10; ++step) {
    const torch::Tensor grad = torch::randn({n}) * (step + 1);
    reference.mutable_grad() = grad.clone();
    libtorch->step();
    hpc_train::adam_update(ours, grad, exp_avg, exp_avg_sq, step + 1, options.lr, options);
  }
  const double relative = ((ours - reference.detach()).norm() / reference.detach().norm()).item<double>();
  EXPECT_LT(relative, 1e-6) << (decoupled ? "AdamW" : "Adam");
}

}  // namespace

TEST(AdamUpdate, MatchesLibTorchAdamW) { compare_with_libtorch(true); }
TEST(AdamUpdate, MatchesLibTorchAdam) { compare_with_libtorch(false); }

TEST(AdamUpdate, FirstStepMovesEachWeightByLr) {
  // After one step with zero weight decay, m/sqrt(v) = sign(g), so every weight moves by lr.
  torch::Tensor p = torch::zeros({4});
  const hpc_train::AdamOptions options{0.1, 0.9, 0.999, 1e-12, 0.0, true};
  hpc_train::adam_update(p, torch::tensor({1.0f, -2.0f, 3.0f, -0.5f}), torch::zeros({4}),
                         torch::zeros({4}), 1, options.lr, options);
  EXPECT_TRUE(torch::allclose(p, torch::tensor({-0.1f, 0.1f, -0.1f, 0.1f}), 0, 1e-6));
}

// --optimizer adamw decays the weights directly, adam adds the decay to the gradient.
TEST(AdamUpdate, OptimizerKindPicksTheWeightDecay) {
  using hpc_train::OptimizerKind;
  const hpc_train::AdamOptions adamw =
      hpc_train::adam_options(OptimizerKind::kAdamW, 1e-3, 0.8, 0.99, 1e-6, 0.05);
  EXPECT_TRUE(adamw.decoupled_weight_decay);
  EXPECT_EQ(adamw.lr, 1e-3);
  EXPECT_EQ(adamw.beta1, 0.8);
  EXPECT_EQ(adamw.beta2, 0.99);
  EXPECT_EQ(adamw.eps, 1e-6);
  EXPECT_EQ(adamw.weight_decay, 0.05);
  const hpc_train::AdamOptions adam =
      hpc_train::adam_options(OptimizerKind::kAdam, 1e-3, 0.8, 0.99, 1e-6, 0.05);
  EXPECT_FALSE(adam.decoupled_weight_decay);
  EXPECT_EQ(adam.weight_decay, 0.05);
}

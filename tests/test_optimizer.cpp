// adam_update and sgd_update against LibTorch's own Adam, AdamW and SGD on the same parameters
// and gradients; LAMB's and LARS's pieces (Note [Trust ratios]) against their papers' formulas.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "hpc_train/error.h"
#include "hpc_train/optim/optimizer.h"

namespace {

void compare_with_libtorch(bool decoupled) {
  torch::manual_seed(7);
  const int64_t n = 1000;
  torch::Tensor reference = torch::randn({n}, torch::kFloat).requires_grad_(true);
  torch::Tensor ours = reference.detach().clone();
  const hpc_train::OptimizerOptions options{
      3e-3, 0.9, 0.99, 1e-8, 0.05,
      decoupled ? hpc_train::OptimizerKind::kAdamW : hpc_train::OptimizerKind::kAdam};
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
    hpc_train::adam_update(ours, grad, exp_avg, exp_avg_sq, step + 1, options.lr, options.beta1,
                           options);
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
  const hpc_train::OptimizerOptions options{0.1, 0.9, 0.999, 1e-12, 0.0};
  hpc_train::adam_update(p, torch::tensor({1.0f, -2.0f, 3.0f, -0.5f}), torch::zeros({4}),
                         torch::zeros({4}), 1, options.lr, options.beta1, options);
  EXPECT_TRUE(torch::allclose(p, torch::tensor({-0.1f, 0.1f, -0.1f, 0.1f}), 0, 1e-6));
}

// --optimizer adamw decays the weights directly, adam and sgd add the decay to the gradient; only
// SGD with momentum (or a cycled one) keeps one buffer, Adam two.
TEST(OptimizerOptions, KindPicksTheWeightDecayAndTheState) {
  using hpc_train::OptimizerKind;
  hpc_train::OptimizerOptions options;
  EXPECT_TRUE(options.decoupled_weight_decay());
  EXPECT_EQ(hpc_train::state_buffers(options, false), 2);
  options.kind = OptimizerKind::kAdam;
  EXPECT_FALSE(options.decoupled_weight_decay());
  EXPECT_EQ(hpc_train::state_buffers(options, true), 2);
  options.kind = OptimizerKind::kSgd;
  EXPECT_FALSE(options.decoupled_weight_decay());
  EXPECT_EQ(hpc_train::state_buffers(options, false), 0);
  EXPECT_EQ(hpc_train::state_buffers(options, true), 1);
  options.momentum = 0.9;
  EXPECT_EQ(hpc_train::state_buffers(options, false), 1);
}

// sgd_update against torch::optim::SGD for every combination torch allows: plain, momentum,
// dampening, Nesterov, with and without weight decay, over steps whose gradients change.
TEST(SgdUpdate, MatchesLibTorchSgd) {
  struct Case {
    double momentum, dampening, weight_decay;
    bool nesterov;
  };
  for (const Case& c : {Case{0.0, 0.0, 0.0, false}, Case{0.0, 0.0, 5e-4, false},
                        Case{0.9, 0.0, 0.0, false}, Case{0.9, 0.1, 5e-4, false},
                        Case{0.9, 0.0, 5e-4, true}, Case{0.5, 0.0, 0.0, true}}) {
    torch::manual_seed(11);
    const int64_t n = 1000;
    torch::Tensor reference = torch::randn({n}, torch::kFloat).requires_grad_(true);
    torch::Tensor ours = reference.detach().clone();
    hpc_train::OptimizerOptions options;
    options.kind = hpc_train::OptimizerKind::kSgd;
    options.lr = 0.05;
    options.weight_decay = c.weight_decay;
    options.momentum = c.momentum;
    options.dampening = c.dampening;
    options.nesterov = c.nesterov;
    torch::optim::SGD libtorch({reference}, torch::optim::SGDOptions(0.05)
                                                .momentum(c.momentum)
                                                .dampening(c.dampening)
                                                .weight_decay(c.weight_decay)
                                                .nesterov(c.nesterov));
    torch::Tensor buffer =
        hpc_train::state_buffers(options, false) == 1 ? torch::zeros_like(ours) : torch::Tensor();
    for (int step = 0; step < 10; ++step) {
      const torch::Tensor grad = torch::randn({n}) * (step + 1);
      reference.mutable_grad() = grad.clone();
      libtorch.step();
      hpc_train::sgd_update(ours, grad, buffer, step + 1, options.lr, options.momentum, options);
    }
    EXPECT_TRUE(torch::equal(ours, reference.detach()))
        << "momentum " << c.momentum << " dampening " << c.dampening << " weight decay "
        << c.weight_decay << " nesterov " << c.nesterov << ": max difference "
        << (ours - reference.detach()).abs().max().item<double>();
  }
}

// A decay mask (--no-decay-bias-bn) is torch's parameter group with weight_decay 0: a weight that
// decays and a bias that does not, as one flat tensor, against AdamW and SGD with two groups.
TEST(OptimizerUpdates, ADecayMaskIsATorchGroupWithoutDecay) {
  for (hpc_train::OptimizerKind kind : {hpc_train::OptimizerKind::kAdamW, hpc_train::OptimizerKind::kSgd}) {
    torch::manual_seed(9);
    torch::Tensor weight = torch::randn({20, 30}).requires_grad_(true);
    torch::Tensor bias = torch::randn({30}).requires_grad_(true);
    torch::Tensor ours = torch::cat({weight.detach().flatten(), bias.detach()});
    const torch::Tensor mask =
        torch::cat({torch::ones({600}, torch::kBool), torch::zeros({30}, torch::kBool)});
    hpc_train::OptimizerOptions options{0.01, 0.9, 0.999, 1e-8, 0.1, kind};
    options.momentum = 0.9;
    std::vector<torch::optim::OptimizerParamGroup> groups;
    std::unique_ptr<torch::optim::Optimizer> libtorch;
    if (kind == hpc_train::OptimizerKind::kAdamW) {
      groups.emplace_back(std::vector<torch::Tensor>{weight},
                          std::make_unique<torch::optim::AdamWOptions>(
                              torch::optim::AdamWOptions(0.01).weight_decay(0.1)));
      groups.emplace_back(std::vector<torch::Tensor>{bias},
                          std::make_unique<torch::optim::AdamWOptions>(
                              torch::optim::AdamWOptions(0.01).weight_decay(0.0)));
      libtorch = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(0.01));
    } else {
      groups.emplace_back(std::vector<torch::Tensor>{weight},
                          std::make_unique<torch::optim::SGDOptions>(
                              torch::optim::SGDOptions(0.01).momentum(0.9).weight_decay(0.1)));
      groups.emplace_back(std::vector<torch::Tensor>{bias},
                          std::make_unique<torch::optim::SGDOptions>(
                              torch::optim::SGDOptions(0.01).momentum(0.9).weight_decay(0.0)));
      libtorch = std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(0.01));
    }
    torch::Tensor first = torch::zeros_like(ours), second = torch::zeros_like(ours);
    for (int step = 0; step < 5; ++step) {
      const torch::Tensor grad = torch::randn({630});
      weight.mutable_grad() = grad.narrow(0, 0, 600).view({20, 30}).clone();
      bias.mutable_grad() = grad.narrow(0, 600, 30).clone();
      libtorch->step();
      if (kind == hpc_train::OptimizerKind::kAdamW)
        hpc_train::adam_update(ours, grad, first, second, step + 1, 0.01, 0.9, options, mask);
      else
        hpc_train::sgd_update(ours, grad, first, step + 1, 0.01, 0.9, options, mask);
    }
    const torch::Tensor reference = torch::cat({weight.detach().flatten(), bias.detach()});
    EXPECT_TRUE(torch::allclose(ours, reference, 1e-6, 1e-7))
        << (kind == hpc_train::OptimizerKind::kSgd ? "SGD" : "AdamW") << ": largest difference "
        << (ours - reference).abs().max().item<double>();
  }
}

// Adam with a beta1 that changes every step (a one-cycle schedule's) is torch's Adam with the
// group's betas changed before each step: the bias correction uses the step's beta1.
TEST(AdamUpdate, ACycledBeta1IsTorchsWithChangedBetas) {
  torch::manual_seed(5);
  const int64_t n = 500;
  torch::Tensor reference = torch::randn({n}, torch::kFloat).requires_grad_(true);
  torch::Tensor ours = reference.detach().clone();
  const hpc_train::OptimizerOptions options{1e-2, 0.9, 0.99, 1e-8, 0.01};
  torch::optim::AdamW libtorch({reference}, torch::optim::AdamWOptions(1e-2)
                                                .betas({0.9, 0.99})
                                                .eps(1e-8)
                                                .weight_decay(0.01));
  torch::Tensor exp_avg = torch::zeros_like(ours), exp_avg_sq = torch::zeros_like(ours);
  for (int step = 0; step < 10; ++step) {
    const double beta1 = 0.9 - 0.01 * step;
    static_cast<torch::optim::AdamWOptions&>(libtorch.param_groups()[0].options())
        .betas({beta1, 0.99});
    const torch::Tensor grad = torch::randn({n});
    reference.mutable_grad() = grad.clone();
    libtorch.step();
    hpc_train::adam_update(ours, grad, exp_avg, exp_avg_sq, step + 1, options.lr, beta1, options);
  }
  const double relative =
      ((ours - reference.detach()).norm() / reference.detach().norm()).item<double>();
  EXPECT_LT(relative, 1e-6);
}

// Note [Trust ratios]: the ratios' rules at their edges, as trust_ratio.h writes them for the
// host and the GPU.
TEST(TrustRatio, LambIsTheNormsRatioWithinItsBounds) {
  EXPECT_DOUBLE_EQ(hpc_train::lamb_trust_ratio(2.0, 0.5, 0.0, 0.0), 4.0);  // no upper bound
  EXPECT_DOUBLE_EQ(hpc_train::lamb_trust_ratio(2.0, 0.5, 0.0, 3.0), 3.0);
  EXPECT_DOUBLE_EQ(hpc_train::lamb_trust_ratio(1.0, 1e3, 0.01, 10.0), 0.01);
  EXPECT_DOUBLE_EQ(hpc_train::lamb_trust_ratio(0.0, 0.5, 0.01, 10.0), 1.0);  // weights at zero
  EXPECT_DOUBLE_EQ(hpc_train::lamb_trust_ratio(2.0, 0.0, 0.01, 10.0), 1.0);  // no direction
}

TEST(TrustRatio, LarsDividesByTheGradientAndTheDecayTerm) {
  EXPECT_DOUBLE_EQ(hpc_train::lars_trust_ratio(3.0, 2.0, 1e-3, 0.1, 1e-8),
                   1e-3 * 3.0 / (2.0 + 0.1 * 3.0 + 1e-8));
  EXPECT_DOUBLE_EQ(hpc_train::lars_trust_ratio(0.0, 2.0, 1e-3, 0.1, 1e-8), 1.0);
  EXPECT_DOUBLE_EQ(hpc_train::lars_trust_ratio(3.0, 0.0, 1e-3, 0.1, 1e-8), 1.0);
}

TEST(TrustRatio, LambCorrectsTheBiasWhereItIsAsked) {
  using hpc_train::LambBiasCorrection;
  const hpc_train::LambCorrection moments =
      hpc_train::lamb_correction(LambBiasCorrection::kMoments, 0.9, 0.999, 2);
  EXPECT_DOUBLE_EQ(moments.moment_scale, 1.0 / (1.0 - 0.9 * 0.9));
  EXPECT_DOUBLE_EQ(moments.root_scale, 1.0 / std::sqrt(1.0 - 0.999 * 0.999));
  EXPECT_DOUBLE_EQ(moments.step_scale, 1.0);
  const hpc_train::LambCorrection step =
      hpc_train::lamb_correction(LambBiasCorrection::kStepSize, 0.9, 0.999, 2);
  EXPECT_DOUBLE_EQ(step.moment_scale, 1.0);
  EXPECT_DOUBLE_EQ(step.root_scale, 1.0);
  EXPECT_DOUBLE_EQ(step.step_scale, std::sqrt(1.0 - 0.999 * 0.999) / (1.0 - 0.9 * 0.9));
  const hpc_train::LambCorrection none =
      hpc_train::lamb_correction(LambBiasCorrection::kNone, 0.9, 0.999, 2);
  EXPECT_DOUBLE_EQ(none.moment_scale * none.root_scale * none.step_scale, 1.0);
}

// LAMB's direction is Adam's bias-corrected m / (sqrt(v) + eps) plus the decay term, written
// out here from the paper's Algorithm 2; LARS's update is SGD's on the scaled direction.
TEST(LayerAdaptiveUpdates, LambDirectionAndLarsUpdateAreThePapers) {
  torch::manual_seed(11);
  const int64_t n = 300;
  hpc_train::OptimizerOptions options{1e-2, 0.9, 0.99, 1e-6, 0.05, hpc_train::OptimizerKind::kLamb};
  const torch::Tensor weights = torch::randn({n});
  torch::Tensor exp_avg = torch::randn({n}) * 0.1, exp_avg_sq = torch::rand({n}) * 0.01;
  const torch::Tensor grads = torch::randn({n});
  const torch::Tensor m = exp_avg * 0.9 + grads * 0.1;
  const torch::Tensor v = exp_avg_sq * 0.99 + grads * grads * 0.01;
  const int64_t step = 3;
  const torch::Tensor want = (m / (1 - std::pow(0.9, step))) /
                                 ((v / (1 - std::pow(0.99, step))).sqrt() + 1e-6) +
                             0.05 * weights;
  const torch::Tensor got = hpc_train::lamb_direction(
      weights, grads, exp_avg, exp_avg_sq, 0.9,
      hpc_train::lamb_correction(hpc_train::LambBiasCorrection::kMoments, 0.9, 0.99, step),
      options, true);
  EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(exp_avg, m));
  EXPECT_TRUE(torch::allclose(exp_avg_sq, v));

  options.kind = hpc_train::OptimizerKind::kLars;
  options.momentum = 0.9;
  options.nesterov = true;
  torch::Tensor lars = weights.clone(), lars_buffer = torch::randn({n});
  torch::Tensor sgd = weights.clone(), sgd_buffer = lars_buffer.clone();
  hpc_train::lars_update(lars, grads, lars_buffer, 2, 0.5, 0.9, options, 0.05, 0.3);
  hpc_train::OptimizerOptions no_decay = options;
  no_decay.weight_decay = 0.0;
  hpc_train::sgd_update(sgd, (grads + 0.05 * weights) * 0.3, sgd_buffer, 2, 0.5, 0.9, no_decay);
  EXPECT_TRUE(torch::allclose(lars, sgd, 1e-6, 1e-7));
  EXPECT_TRUE(torch::allclose(lars_buffer, sgd_buffer, 1e-6, 1e-7));
}

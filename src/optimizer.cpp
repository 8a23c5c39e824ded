#include "hpc_train/optimizer.h"

#include <ATen/ATen.h>

#include <cmath>

#include "hpc_train/error.h"

namespace hpc_train {

AdamOptions adam_options(const std::string& optimizer, double lr, double beta1, double beta2,
                         double eps, double weight_decay) {
  if (optimizer != "adamw" && optimizer != "adam")
    throw ConfigError("--optimizer " + optimizer + ": unknown optimizer; use adamw or adam");
  return AdamOptions{lr, beta1, beta2, eps, weight_decay, optimizer == "adamw"};
}

FlatAdam::FlatAdam(const AdamOptions& options, const at::Tensor& like_parameters)
    : options_(options),
      exp_avg_(at::zeros_like(like_parameters)),
      exp_avg_sq_(at::zeros_like(like_parameters)) {}

void FlatAdam::step(at::Tensor& parameters, const at::Tensor& grads) {
  ++steps_taken_;
  const double lr = options_.lr;
  const double bias_correction1 = 1.0 - std::pow(options_.beta1, steps_taken_);
  const double bias_correction2 = 1.0 - std::pow(options_.beta2, steps_taken_);
  at::Tensor grad = grads;
  if (options_.weight_decay != 0.0) {
    if (options_.decoupled_weight_decay) parameters.mul_(1.0 - lr * options_.weight_decay);
    else grad = grads.add(parameters, options_.weight_decay);
  }
  exp_avg_.mul_(options_.beta1).add_(grad, 1.0 - options_.beta1);
  exp_avg_sq_.mul_(options_.beta2).addcmul_(grad, grad, 1.0 - options_.beta2);
  // Same order of operations as torch.optim's single-tensor Adam, so results agree closely.
  const at::Tensor denom =
      (exp_avg_sq_.sqrt() / std::sqrt(bias_correction2)).add_(options_.eps);
  parameters.addcdiv_(exp_avg_, denom, -lr / bias_correction1);
}

int64_t FlatAdam::state_bytes() const {
  return exp_avg_.numel() * exp_avg_.element_size() + exp_avg_sq_.numel() * exp_avg_sq_.element_size();
}

}  // namespace hpc_train

#include "hpc_train/optim/optimizer.h"

#include <ATen/ATen.h>

#include <cmath>

namespace hpc_train {

AdamOptions adam_options(OptimizerKind optimizer, double lr, double beta1, double beta2,
                         double eps, double weight_decay) {
  return AdamOptions{lr, beta1, beta2, eps, weight_decay, optimizer == OptimizerKind::kAdamW};
}

void adam_update(at::Tensor parameters, const at::Tensor& grads, at::Tensor exp_avg,
                 at::Tensor exp_avg_sq, int64_t step, double lr, const AdamOptions& options) {
  const double bias_correction1 = 1.0 - std::pow(options.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(options.beta2, static_cast<double>(step));
  at::Tensor grad = grads;
  if (options.weight_decay != 0.0) {
    if (options.decoupled_weight_decay) parameters.mul_(1.0 - lr * options.weight_decay);
    else grad = grads.add(parameters, options.weight_decay);
  }
  exp_avg.mul_(options.beta1).add_(grad, 1.0 - options.beta1);
  exp_avg_sq.mul_(options.beta2).addcmul_(grad, grad, 1.0 - options.beta2);
  // Same order of operations as torch.optim's single-tensor Adam, so results agree closely.
  const at::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(options.eps);
  parameters.addcdiv_(exp_avg, denom, -lr / bias_correction1);
}

}  // namespace hpc_train

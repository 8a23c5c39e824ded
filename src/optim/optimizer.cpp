#include "hpc_train/optim/optimizer.h"

#include <ATen/ATen.h>

#include <cmath>

namespace hpc_train {

int state_buffers(const OptimizerOptions& options, bool cycled_momentum) {
  if (options.adam()) return 2;
  return options.momentum != 0.0 || cycled_momentum ? 1 : 0;
}

namespace {

// The gradient with weight decay as an L2 term (Adam, SGD), where `decay_mask` lets it.
at::Tensor with_l2_term(const at::Tensor& grads, const at::Tensor& parameters,
                        double weight_decay, const at::Tensor& decay_mask) {
  const at::Tensor decayed = grads.add(parameters, weight_decay);
  return decay_mask.defined() ? at::where(decay_mask, decayed, grads) : decayed;
}

// Adam's moments (Adam, AdamW, LAMB): m = beta1 m + (1 - beta1) g, v = beta2 v + (1 - beta2) g^2.
void move_moments(at::Tensor exp_avg, at::Tensor exp_avg_sq, const at::Tensor& grad, double beta1,
                  double beta2) {
  exp_avg.mul_(beta1).add_(grad, 1.0 - beta1);
  exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1.0 - beta2);
}

// SGD's momentum and step from a direction that holds the weight decay already.
void momentum_step(at::Tensor parameters, at::Tensor direction, at::Tensor momentum_buffer,
                   int64_t step, double lr, double momentum, const OptimizerOptions& options) {
  if (momentum_buffer.defined()) {
    if (step == 1) momentum_buffer.copy_(direction);
    else momentum_buffer.mul_(momentum).add_(direction, 1.0 - options.dampening);
    direction = options.nesterov ? direction.add(momentum_buffer, momentum) : momentum_buffer;
  }
  parameters.add_(direction, -lr);
}

}  // namespace

void adam_update(at::Tensor parameters, const at::Tensor& grads, at::Tensor exp_avg,
                 at::Tensor exp_avg_sq, int64_t step, double lr, double beta1,
                 const OptimizerOptions& options, const at::Tensor& decay_mask) {
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(options.beta2, static_cast<double>(step));
  at::Tensor grad = grads;
  if (options.weight_decay != 0.0) {
    const double decay_factor = 1.0 - lr * options.weight_decay;
    if (!options.decoupled_weight_decay())
      grad = with_l2_term(grads, parameters, options.weight_decay, decay_mask);
    else if (decay_mask.defined())
      parameters.copy_(at::where(decay_mask, parameters * decay_factor, parameters));
    else
      parameters.mul_(decay_factor);
  }
  move_moments(exp_avg, exp_avg_sq, grad, beta1, options.beta2);
  // Same order of operations as torch.optim's single-tensor Adam, so results agree closely.
  const at::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(options.eps);
  parameters.addcdiv_(exp_avg, denom, -lr / bias_correction1);
}

void sgd_update(at::Tensor parameters, const at::Tensor& grads, at::Tensor momentum_buffer,
                int64_t step, double lr, double momentum, const OptimizerOptions& options,
                const at::Tensor& decay_mask) {
  // torch.optim.SGD's single-tensor step, operation for operation.
  at::Tensor direction = grads;
  if (options.weight_decay != 0.0)
    direction = with_l2_term(grads, parameters, options.weight_decay, decay_mask);
  momentum_step(parameters, direction, momentum_buffer, step, lr, momentum, options);
}

at::Tensor lamb_direction(const at::Tensor& parameters, const at::Tensor& grads,
                          at::Tensor exp_avg, at::Tensor exp_avg_sq, double beta1,
                          const LambCorrection& correction, const OptimizerOptions& options,
                          bool decays) {
  move_moments(exp_avg, exp_avg_sq, grads, beta1, options.beta2);
  at::Tensor direction = exp_avg.mul(correction.moment_scale)
                             .div_(exp_avg_sq.sqrt().mul_(correction.root_scale).add_(options.eps));
  if (decays && options.weight_decay != 0.0) direction.add_(parameters, options.weight_decay);
  return direction;
}

void lars_update(at::Tensor parameters, const at::Tensor& grads, at::Tensor momentum_buffer,
                 int64_t step, double lr, double momentum, const OptimizerOptions& options,
                 double weight_decay, double trust_ratio) {
  // timm's Lars: grad.add_(p, alpha=weight_decay).mul_(trust_ratio), then SGD's momentum.
  at::Tensor direction = weight_decay != 0.0 ? grads.add(parameters, weight_decay) : grads.clone();
  direction.mul_(trust_ratio);
  momentum_step(parameters, direction, momentum_buffer, step, lr, momentum, options);
}

}  // namespace hpc_train

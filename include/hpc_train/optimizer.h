// The optimizer: Adam and AdamW over a flat fp32 parameter buffer (flat_parameters.h), with the
// same arithmetic as torch.optim.Adam / AdamW (bias-corrected moments; AdamW decays the weights
// directly, Adam adds weight_decay * p to the gradient).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace hpc_train {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  bool decoupled_weight_decay = true;  // true: AdamW, false: Adam with L2 penalty
};

// "adamw" | "adam" -> options with those hyper-parameters.
AdamOptions adam_options(const std::string& optimizer, double lr, double beta1, double beta2,
                         double eps, double weight_decay);

class FlatAdam {
 public:
  FlatAdam(const AdamOptions& options, const at::Tensor& like_parameters);

  // One update of `parameters` (in place) from `grads`; both flat, same shape as at construction.
  void step(at::Tensor& parameters, const at::Tensor& grads);

  int64_t steps_taken() const { return steps_taken_; }
  const at::Tensor& exp_avg() const { return exp_avg_; }
  const at::Tensor& exp_avg_sq() const { return exp_avg_sq_; }
  // Bytes of optimizer state held by this rank (both moments).
  int64_t state_bytes() const;

 private:
  AdamOptions options_;
  int64_t steps_taken_ = 0;
  at::Tensor exp_avg_;
  at::Tensor exp_avg_sq_;
};

}  // namespace hpc_train

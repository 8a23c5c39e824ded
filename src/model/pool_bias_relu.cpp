// max_pool_bias_relu (pool_bias_relu.h): the choice between the fused kernels and LibTorch's ops.
#include "hpc_train/model/pool_bias_relu.h"

#include <torch/torch.h>

#include <atomic>

namespace hpc_train {

namespace {
std::atomic<bool> fused_enabled{true};
}  // namespace

void set_fused_pooling(bool enabled) { fused_enabled = enabled; }

bool fused_pooling_applies(const torch::Tensor& x, const torch::Tensor& bias) {
  return fused_enabled && detail::fused_pooling_takes(x, bias);
}

torch::Tensor max_pool_bias_relu(const torch::Tensor& x, const torch::Tensor& bias,
                                 at::MemoryFormat pooled_format) {
  if (fused_pooling_applies(x, bias))
    return detail::fused_max_pool_bias_relu(x, bias, pooled_format);
  return torch::relu(torch::max_pool2d(x, 2) + bias.view({1, -1, 1, 1}));
}

}  // namespace hpc_train

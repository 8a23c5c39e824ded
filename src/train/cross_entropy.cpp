// mean_cross_entropy (cross_entropy.h): the fused kernels where they apply, else LibTorch's ops.
#include "hpc_train/train/cross_entropy.h"

#include <torch/torch.h>

namespace hpc_train {

torch::Tensor mean_cross_entropy(const torch::Tensor& logits, const torch::Tensor& labels,
                                 double label_smoothing) {
  if (fused_cross_entropy_applies(logits, labels))
    return detail::fused_cross_entropy(logits, labels, label_smoothing);
  return torch::nn::functional::cross_entropy(
      logits.to(torch::kFloat), labels,
      torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(label_smoothing));
}

}  // namespace hpc_train

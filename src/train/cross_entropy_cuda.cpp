// The fused path of mean_cross_entropy in a GPU build (cross_entropy.h): which inputs the kernels
// of cross_entropy.cu take, and an autograd function around them. The CPU build's is
// cross_entropy_cpu.cpp.
#include <ATen/cuda/CUDAContext.h>
#include <torch/torch.h>

#include <optional>

#include "hpc_train/runtime/kernel_dtype_torch.h"
#include "hpc_train/train/cross_entropy.h"
#include "hpc_train/train/fused_cross_entropy.h"

namespace hpc_train {

namespace {

CrossEntropyShape shape_of(const torch::Tensor& logits, double label_smoothing) {
  CrossEntropyShape s;
  s.rows = logits.size(0);
  s.classes = logits.size(1);
  s.label_smoothing = static_cast<float>(label_smoothing);
  return s;
}

class FusedCrossEntropy : public torch::autograd::Function<FusedCrossEntropy> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& labels, double label_smoothing) {
    const auto fp32 = logits.options().dtype(torch::kFloat);
    torch::Tensor lse = torch::empty({logits.size(0)}, fp32);
    torch::Tensor loss = torch::empty({}, fp32);
    launch_cross_entropy_forward(shape_of(logits, label_smoothing),
                                 *kernel_dtype_of(logits.scalar_type()),
                                 logits.data_ptr(), labels.data_ptr<int64_t>(),
                                 lse.data_ptr<float>(), loss.data_ptr<float>(),
                                 at::cuda::getCurrentCUDAStream());
    ctx->save_for_backward({logits, labels, lse});
    ctx->saved_data["label_smoothing"] = label_smoothing;
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &logits = saved[0], &labels = saved[1], &lse = saved[2];
    const torch::Tensor grad_loss = grad_outputs[0].to(torch::kFloat).contiguous();
    torch::Tensor grad_logits = torch::empty_like(logits);
    const double label_smoothing = ctx->saved_data["label_smoothing"].toDouble();
    launch_cross_entropy_backward(shape_of(logits, label_smoothing),
                                  *kernel_dtype_of(logits.scalar_type()),
                                  logits.data_ptr(), labels.data_ptr<int64_t>(),
                                  lse.data_ptr<float>(), grad_loss.data_ptr<float>(),
                                  grad_logits.data_ptr(), at::cuda::getCurrentCUDAStream());
    return {grad_logits, torch::Tensor(), torch::Tensor()};  // labels and smoothing have none
  }
};

}  // namespace

bool fused_cross_entropy_applies(const torch::Tensor& logits, const torch::Tensor& labels) {
  return logits.defined() && logits.is_cuda() && logits.dim() == 2 && logits.size(0) > 0 &&
         logits.size(1) > 0 && logits.is_contiguous() &&
         kernel_dtype_of(logits.scalar_type()).has_value() && labels.defined() &&
         labels.dim() == 1 && labels.size(0) == logits.size(0) &&
         labels.scalar_type() == torch::kLong && labels.device() == logits.device() &&
         labels.is_contiguous();
}

namespace detail {
torch::Tensor fused_cross_entropy(const torch::Tensor& logits, const torch::Tensor& labels,
                                  double label_smoothing) {
  return FusedCrossEntropy::apply(logits, labels, label_smoothing);
}
}  // namespace detail

}  // namespace hpc_train

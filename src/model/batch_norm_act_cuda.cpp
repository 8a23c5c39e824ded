// The fused path of batch_norm_act in a GPU build (batch_norm_act.h): which inputs the kernels
// of fused_batch_norm.cu take, and an autograd function around them. The CPU build's is
// batch_norm_act_cpu.cpp.
#include <ATen/cuda/CUDAContext.h>
#include <torch/torch.h>

#include <cstdint>
#include <optional>

#include "hpc_train/model/batch_norm_act.h"
#include "hpc_train/model/fused_batch_norm.h"
#include "hpc_train/runtime/kernel_dtype_torch.h"

namespace hpc_train::detail {

namespace {

// [N, C, H, W] channels-last is [rows = N x H x W, C] in memory.
int64_t rows_of(const torch::Tensor& x) { return x.numel() / x.size(1); }

BnLayout layout_of(const torch::Tensor& x) {
  return bn_layout(rows_of(x), x.size(1), *kernel_dtype_of(x.scalar_type()));
}

// The kernels read and write activations 16 bytes at a time.
bool activation_fits(const torch::Tensor& t, const torch::Tensor& x) {
  return t.defined() && t.sizes() == x.sizes() && t.scalar_type() == x.scalar_type() &&
         t.device() == x.device() && t.is_contiguous(at::MemoryFormat::ChannelsLast) &&
         reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// Weight, bias and running statistics: one dtype, the activations' or fp32.
bool parameter_fits(const torch::Tensor& t, const torch::Tensor& x, c10::ScalarType dtype) {
  return t.defined() && t.dim() == 1 && t.size(0) == x.size(1) && t.is_contiguous() &&
         t.device() == x.device() && t.scalar_type() == dtype;
}

torch::Tensor float_tensor(int64_t elements, const torch::Tensor& like) {
  return torch::empty({elements}, like.options().dtype(torch::kFloat));
}

const void* data_or_null(const torch::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

std::optional<CounterType> counter_type_of(const torch::Tensor& counter) {
  if (!counter.defined() || counter.numel() != 1 || !counter.is_cuda()) return std::nullopt;
  switch (counter.scalar_type()) {
    case torch::kLong: return CounterType::kInt64;
    case torch::kFloat: return CounterType::kFloat32;
    case torch::kHalf: return CounterType::kFloat16;
    case torch::kBFloat16: return CounterType::kBFloat16;
    default: return std::nullopt;
  }
}

class FusedBatchNormAct : public torch::autograd::Function<FusedBatchNormAct> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               const c10::optional<torch::Tensor>& residual,
                               torch::Tensor running_mean, torch::Tensor running_var,
                               torch::Tensor batches_tracked, double momentum, double eps,
                               bool relu) {
    const BnLayout layout = layout_of(x);
    const torch::Tensor save_mean = float_tensor(layout.channels, x);
    const torch::Tensor save_invstd = float_tensor(layout.channels, x);
    const torch::Tensor workspace = float_tensor(layout.workspace_floats, x);
    torch::Tensor y = torch::empty_like(x, at::MemoryFormat::ChannelsLast);
    BnForwardArgs args;
    args.x = x.data_ptr();
    args.residual = residual ? residual->data_ptr() : nullptr;
    args.y = y.data_ptr();
    args.relu = relu;
    args.param_dtype = *kernel_dtype_of(weight.scalar_type());
    args.weight = weight.data_ptr();
    args.bias = bias.data_ptr();
    args.running_mean = running_mean.data_ptr();
    args.running_var = running_var.data_ptr();
    args.momentum = static_cast<float>(momentum);
    args.eps = static_cast<float>(eps);
    args.save_mean = save_mean.data_ptr<float>();
    args.save_invstd = save_invstd.data_ptr<float>();
    args.workspace = workspace.data_ptr<float>();
    if (const std::optional<CounterType> counter = counter_type_of(batches_tracked)) {
      args.batches_tracked = batches_tracked.data_ptr();
      args.batches_tracked_type = *counter;
    } else {
      batches_tracked.add_(1);  // a counter the kernel does not take: as BatchNorm's own forward
    }
    launch_bn_forward(layout, args, at::cuda::getCurrentCUDAStream());
    // The output is saved for the ReLU's mask only: without a ReLU, backward needs x alone.
    ctx->save_for_backward({x, relu ? y : torch::Tensor(), weight, save_mean, save_invstd});
    ctx->saved_data["relu"] = relu;
    ctx->saved_data["residual"] = residual.has_value();
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &y = saved[1], &weight = saved[2];
    const torch::Tensor &save_mean = saved[3], &save_invstd = saved[4];
    const bool relu = ctx->saved_data["relu"].toBool();
    const bool residual = ctx->saved_data["residual"].toBool();
    const torch::Tensor dy = grad_outputs[0].contiguous(at::MemoryFormat::ChannelsLast);
    const BnLayout layout = layout_of(x);
    torch::Tensor dx = torch::empty_like(x, at::MemoryFormat::ChannelsLast);
    torch::Tensor dresidual =
        residual ? torch::empty_like(x, at::MemoryFormat::ChannelsLast) : torch::Tensor();
    torch::Tensor dweight = torch::empty_like(weight), dbias = torch::empty_like(weight);
    const torch::Tensor workspace = float_tensor(layout.workspace_floats, x);
    BnBackwardArgs args;
    args.dy = dy.data_ptr();
    args.y = data_or_null(y);
    args.x = x.data_ptr();
    args.relu = relu;
    args.param_dtype = *kernel_dtype_of(weight.scalar_type());
    args.weight = weight.data_ptr();
    args.save_mean = save_mean.data_ptr<float>();
    args.save_invstd = save_invstd.data_ptr<float>();
    args.dx = dx.data_ptr();
    args.dresidual = residual ? dresidual.data_ptr() : nullptr;
    args.dweight = dweight.data_ptr();
    args.dbias = dbias.data_ptr();
    args.workspace = workspace.data_ptr<float>();
    launch_bn_backward(layout, args, at::cuda::getCurrentCUDAStream());
    // One gradient per forward input: x, weight, bias, residual, and none for the running
    // statistics, the counter, momentum, eps and relu.
    return {dx, dweight, dbias, dresidual, torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool fused_kernels_take(const torch::Tensor& x, const torch::nn::BatchNorm2dImpl& bn,
                        const torch::Tensor& residual) {
  if (!x.defined() || !x.is_cuda() || x.dim() != 4) return false;
  const std::optional<KernelDtype> dtype = kernel_dtype_of(x.scalar_type());
  if (!dtype || !bn_layout_fits(rows_of(x), x.size(1), *dtype) || !activation_fits(x, x))
    return false;
  if (residual.defined() && !activation_fits(residual, x)) return false;
  const c10::ScalarType parameters = bn.weight.defined() ? bn.weight.scalar_type() : x.scalar_type();
  if (parameters != x.scalar_type() && parameters != torch::kFloat) return false;
  for (const torch::Tensor* t : {&bn.weight, &bn.bias, &bn.running_mean, &bn.running_var})
    if (!parameter_fits(*t, x, parameters)) return false;
  return true;
}

torch::Tensor fused_batch_norm_act(const torch::Tensor& x, torch::nn::BatchNorm2dImpl& bn,
                                   const torch::Tensor& residual, Activation activation) {
  // num_batches_tracked advances in training mode, as in BatchNorm's own forward: in the kernels.
  // No residual is an empty optional, which autograd takes for a non-tensor argument (an
  // undefined tensor it would describe as an input, and fail).
  const c10::optional<torch::Tensor> optional_residual =
      residual.defined() ? c10::optional<torch::Tensor>(residual) : c10::nullopt;
  return FusedBatchNormAct::apply(x, bn.weight, bn.bias, optional_residual, bn.running_mean,
                                  bn.running_var, bn.num_batches_tracked,
                                  *bn.options.momentum(), bn.options.eps(),
                                  activation == Activation::kRelu);
}

}  // namespace hpc_train::detail

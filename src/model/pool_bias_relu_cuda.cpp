// The fused path of max_pool_bias_relu in a GPU build (pool_bias_relu.h): which inputs the
// kernels of fused_pooling.cu take, and an autograd function around them. The CPU build's is
// pool_bias_relu_cpu.cpp.
#include <ATen/cuda/CUDAContext.h>
#include <torch/torch.h>

#include <cstdint>
#include <optional>

#include "hpc_train/model/fused_pooling.h"
#include "hpc_train/model/pool_bias_relu.h"
#include "hpc_train/runtime/kernel_dtype_torch.h"

namespace hpc_train::detail {

namespace {

// The kernels read the input and the channels-last gradients 16 bytes at a time.
bool aligned_16(const torch::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// `t` in `format` at a 16-byte boundary (a copy only where it is not).
torch::Tensor in_kernel_layout(const torch::Tensor& t, at::MemoryFormat format) {
  torch::Tensor laid_out = t.contiguous(format);
  return aligned_16(laid_out) ? laid_out : laid_out.clone(format);
}

// x [N, C, H, W]; the output's strides from `pooled` [N, C, H/2, W/2].
PoolShape pool_shape(at::IntArrayRef input_sizes, const torch::Tensor& pooled) {
  PoolShape s;
  s.batch = input_sizes[0];
  s.channels = input_sizes[1];
  s.height = input_sizes[2];
  s.width = input_sizes[3];
  s.pooled_height = s.height / 2;
  s.pooled_width = s.width / 2;
  if (pooled.defined()) {
    s.out_stride_n = pooled.stride(0);
    s.out_stride_c = pooled.stride(1);
    s.out_stride_h = pooled.stride(2);
    s.out_stride_w = pooled.stride(3);
  }
  return s;
}

at::MemoryFormat format_of(bool nchw) {
  return nchw ? at::MemoryFormat::Contiguous : at::MemoryFormat::ChannelsLast;
}

class FusedMaxPoolBiasRelu : public torch::autograd::Function<FusedMaxPoolBiasRelu> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& bias, bool pooled_nchw) {
    const int64_t pooled_height = x.size(2) / 2, pooled_width = x.size(3) / 2;
    torch::Tensor y = torch::empty({x.size(0), x.size(1), pooled_height, pooled_width},
                                   x.options().memory_format(format_of(pooled_nchw)));
    torch::Tensor window_index = torch::empty({y.numel()}, x.options().dtype(torch::kUInt8));
    const PoolShape shape = pool_shape(x.sizes(), y);
    PoolForwardArgs args;
    args.x = x.data_ptr();
    args.bias = bias.data_ptr();
    args.y = y.data_ptr();
    args.window_index = window_index.data_ptr<uint8_t>();
    launch_pool_bias_relu_forward(shape, *kernel_dtype_of(x.scalar_type()), args,
                                  at::cuda::getCurrentCUDAStream());
    ctx->save_for_backward({y, window_index});
    ctx->saved_data["input_sizes"] = x.sizes().vec();
    ctx->saved_data["pooled_nchw"] = pooled_nchw;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &y = saved[0], &window_index = saved[1];
    const std::vector<int64_t> input_sizes = ctx->saved_data["input_sizes"].toIntVector();
    const at::MemoryFormat pooled_format = format_of(ctx->saved_data["pooled_nchw"].toBool());
    const torch::Tensor dy = in_kernel_layout(grad_outputs[0], pooled_format);
    const PoolShape shape = pool_shape(input_sizes, y);
    const auto channels_last = y.options().memory_format(at::MemoryFormat::ChannelsLast);
    // Only the windows' pixels are written: an odd last row or column gets no gradient.
    // (torch::zeros would drop the memory format.)
    torch::Tensor dx = torch::empty(input_sizes, channels_last);
    if (shape.height % 2 != 0 || shape.width % 2 != 0) dx.zero_();
    const KernelDtype dtype = *kernel_dtype_of(y.scalar_type());
    torch::Tensor bias_grad = torch::empty({shape.channels}, y.options());
    torch::Tensor partials =
        torch::empty({pool_backward_partials(shape, dtype)}, y.options().dtype(torch::kFloat));
    PoolBackwardArgs args;
    args.dy = dy.data_ptr();
    args.y = y.data_ptr();
    args.window_index = window_index.data_ptr<uint8_t>();
    args.dx = dx.data_ptr();
    args.bias_grad = bias_grad.data_ptr();
    args.partials = partials.data_ptr<float>();
    launch_pool_bias_relu_backward(shape, dtype, args, at::cuda::getCurrentCUDAStream());
    // One gradient per forward input: x, bias, and none for pooled_nchw.
    return {dx, bias_grad, torch::Tensor()};
  }
};

}  // namespace

bool fused_pooling_takes(const torch::Tensor& x, const torch::Tensor& bias) {
  if (!x.defined() || !x.is_cuda() || x.dim() != 4) return false;
  const std::optional<KernelDtype> dtype = kernel_dtype_of(x.scalar_type());
  if (!dtype || !fused_pooling_fits(pool_shape(x.sizes(), torch::Tensor()), *dtype)) return false;
  if (!x.is_contiguous(at::MemoryFormat::ChannelsLast) || !aligned_16(x)) return false;
  return bias.defined() && bias.dim() == 1 && bias.size(0) == x.size(1) &&
         bias.scalar_type() == x.scalar_type() && bias.device() == x.device() &&
         bias.is_contiguous();
}

torch::Tensor fused_max_pool_bias_relu(const torch::Tensor& x, const torch::Tensor& bias,
                                       at::MemoryFormat pooled_format) {
  return FusedMaxPoolBiasRelu::apply(x, bias, pooled_format == at::MemoryFormat::Contiguous);
}

}  // namespace hpc_train::detail

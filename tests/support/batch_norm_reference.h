// The fused batch norm's reference and tolerances, shared by its tests: test_fused_batch_norm
// (the kernels on a GPU, through batch_norm_act) and test_fused_batch_norm_emulated (the same
// kernels on the CPU, cuda_emulation.h). A case's inputs in its dtypes, LibTorch's batch_norm,
// add and ReLU on them in fp64, and the comparison of every output.
//
// Note [Fused batch norm tolerances]
// The inputs are the dtype's values and the reference computes from exactly those in fp64, so
// the fused result differs by its fp32 arithmetic and its one rounding to the dtype. With u the
// dtype's unit roundoff (2^-24, 2^-11, 2^-8 for fp32, fp16, bf16):
//   elementwise outputs (y, dx, dresidual), running statistics:
//       |fused - ref| <= 2u |ref| + 1e-4 max|ref|     (the second term: fp32's statistics)
//   sums over the rows (dweight, dbias):
//       |fused - ref| <= 2u |ref| + 1e-5 sum|terms|   (fp32 accumulation over up to 2^18 rows)
//   dweight also: + 4 u32 sum(|g| (|x| + |mean|) invstd), u32 = 2^-24
// The last term is x - mean's rounding in fp32, which xhat carries whatever the dtype: where the
// mean is large against the spread it cancels, and with few rows that the ReLU mostly masks,
// sum|g xhat| can be far below it ([7,128,1,1] in fp32 failed 3 runs of 50 on an H100 without
// it, by up to 1.46x the tolerance).
// The backward reference takes the ReLU's mask from the fused output, so that a value rounding
// to either side of 0 cannot flip a mask between the two. A wrong term (a missing invstd, the
// biased variance for the unbiased, a mean left out of dx, a wrong channel) moves values by a
// large fraction of max|ref|, far outside these bounds.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <string>
#include <vector>

#include "rounding.h"

namespace hpc_train::testing {

struct Case {
  std::vector<int64_t> shape;  // N, C, H, W
  c10::ScalarType dtype;       // activations
  c10::ScalarType param_dtype;
  bool relu;
  bool residual;

  std::string name() const {
    char text[160];
    std::snprintf(text, sizeof text, "[%lld,%lld,%lld,%lld] %s params %s%s%s",
                  static_cast<long long>(shape[0]), static_cast<long long>(shape[1]),
                  static_cast<long long>(shape[2]), static_cast<long long>(shape[3]),
                  c10::toString(dtype), c10::toString(param_dtype), relu ? " relu" : "",
                  residual ? " residual" : "");
    return text;
  }
};

// One case's inputs, in the case's dtypes.
struct Inputs {
  torch::Tensor x, residual, dy;
  torch::Tensor weight, bias, running_mean, running_var;

  Inputs(const Case& c, const torch::Device& device) {
    const int64_t channels = c.shape[1];
    const auto f64 = torch::TensorOptions().dtype(torch::kDouble).device(device);
    auto channels_last = [&](const torch::Tensor& t, c10::ScalarType dtype) {
      return t.to(dtype).contiguous(at::MemoryFormat::ChannelsLast);
    };
    // Per-channel offsets and spreads, so that the mean matters and channels differ.
    const torch::Tensor offset = torch::randn({1, channels, 1, 1}, f64) * 3;
    const torch::Tensor spread = torch::rand({1, channels, 1, 1}, f64) * 2 + 0.5;
    x = channels_last(torch::randn(c.shape, f64) * spread + offset, c.dtype);
    if (c.residual) residual = channels_last(torch::randn(c.shape, f64), c.dtype);
    dy = channels_last(torch::randn(c.shape, f64), c.dtype);
    weight = (torch::rand({channels}, f64) + 0.5).to(c.param_dtype);
    bias = (torch::randn({channels}, f64) * 0.5).to(c.param_dtype);
    running_mean = torch::randn({channels}, f64).to(c.param_dtype);
    running_var = (torch::rand({channels}, f64) + 0.5).to(c.param_dtype);
  }
};

// The outputs of one forward and backward.
struct Outputs {
  torch::Tensor y, dx, dresidual, dweight, dbias, running_mean, running_var;
};

// LibTorch's batch_norm, add and ReLU in fp64 on the same inputs; backward through the mask of
// the fused output (Note [Fused batch norm tolerances]). Also the sums of |terms| of dweight
// and dbias, and of |g| (|x| + |mean|) invstd, for their tolerances.
struct Reference {
  Outputs out;
  torch::Tensor dweight_terms, dbias_terms, xhat_rounding_terms;
};

inline Reference run_reference(const Case& c, const Inputs& in, const torch::Tensor& fused_y) {
  auto f64 = [](const torch::Tensor& t) { return t.to(torch::kDouble); };
  const torch::Tensor x = f64(in.x).requires_grad_();
  const torch::Tensor weight = f64(in.weight).requires_grad_();
  const torch::Tensor bias = f64(in.bias).requires_grad_();
  const torch::Tensor residual = c.residual ? f64(in.residual).requires_grad_() : torch::Tensor();
  Reference ref;
  ref.out.running_mean = f64(in.running_mean);
  ref.out.running_var = f64(in.running_var);
  torch::Tensor z = torch::batch_norm(x, weight, bias, ref.out.running_mean, ref.out.running_var,
                                      /*training=*/true, /*momentum=*/0.1, /*eps=*/1e-5,
                                      /*cudnn_enabled=*/false);
  if (c.residual) z = z + residual;
  ref.out.y = (c.relu ? torch::relu(z) : z).detach();
  const torch::Tensor mask = c.relu ? (f64(fused_y) > 0).to(torch::kDouble) : torch::ones_like(z);
  const torch::Tensor g = f64(in.dy) * mask;
  z.backward(g);
  ref.out.dx = x.grad();
  if (c.residual) ref.out.dresidual = residual.grad();
  ref.out.dweight = weight.grad();
  ref.out.dbias = bias.grad();
  // The batch's statistics as batch norm's training forward takes them (biased variance).
  const torch::Tensor mean = x.detach().mean({0, 2, 3}, /*keepdim=*/true);
  const torch::Tensor centred = x.detach() - mean;
  const torch::Tensor invstd =
      ((centred * centred).mean({0, 2, 3}, /*keepdim=*/true) + 1e-5).rsqrt();
  const torch::Tensor x_hat = centred * invstd;
  ref.dweight_terms = (g * x_hat).abs().sum({0, 2, 3});
  ref.dbias_terms = g.abs().sum({0, 2, 3});
  ref.xhat_rounding_terms = (g.abs() * (x.detach().abs() + mean.abs()) * invstd).sum({0, 2, 3});
  return ref;
}

// The worst |fused - ref| / tolerance of one output; > 1 fails.
inline double worst_ratio(const torch::Tensor& fused, const torch::Tensor& ref,
                   const torch::Tensor& tolerance) {
  return ((fused.to(torch::kDouble) - ref).abs() / tolerance).max().item<double>();
}

inline void expect_elementwise(const std::string& what, const Case& c, const torch::Tensor& fused,
                        const torch::Tensor& ref) {
  const double u = unit_roundoff(fused.scalar_type());
  const torch::Tensor tolerance = 2 * u * ref.abs() + 1e-4 * ref.abs().max() + 1e-300;
  const double ratio = worst_ratio(fused, ref, tolerance);
  EXPECT_LE(ratio, 1.0) << c.name() << ": " << what << " worst error/tolerance " << ratio;
}

// `rounding`: what the fp32 arithmetic adds to the sum's tolerance beyond its terms (dweight's).
inline void expect_sum(const std::string& what, const Case& c, const torch::Tensor& fused,
                const torch::Tensor& ref, const torch::Tensor& terms,
                const torch::Tensor& rounding = {}) {
  const double u = unit_roundoff(fused.scalar_type());
  torch::Tensor tolerance = 2 * u * ref.abs() + 1e-5 * terms + 1e-300;
  if (rounding.defined()) tolerance = tolerance + rounding;
  const double ratio = worst_ratio(fused, ref, tolerance);
  EXPECT_LE(ratio, 1.0) << c.name() << ": " << what << " worst error/tolerance " << ratio;
}


// Every output of one forward and backward against the reference (Note [Fused batch norm
// tolerances]); a failure names the case and the output.
inline void expect_matches_reference(const Case& c, const Inputs& in, const Outputs& fused) {
  const Reference ref = run_reference(c, in, fused.y);
  expect_elementwise("y", c, fused.y, ref.out.y);
  expect_elementwise("dx", c, fused.dx, ref.out.dx);
  if (c.residual) expect_elementwise("dresidual", c, fused.dresidual, ref.out.dresidual);
  expect_sum("dweight", c, fused.dweight, ref.out.dweight, ref.dweight_terms,
             4 * unit_roundoff(torch::kFloat) * ref.xhat_rounding_terms);
  expect_sum("dbias", c, fused.dbias, ref.out.dbias, ref.dbias_terms);
  expect_elementwise("running_mean", c, fused.running_mean, ref.out.running_mean);
  expect_elementwise("running_var", c, fused.running_var, ref.out.running_var);
}

}  // namespace hpc_train::testing

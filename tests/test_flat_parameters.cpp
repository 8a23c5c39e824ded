// Flat storage: parameters are views of a buffer laid out by buckets (padding included),
// backward's gradients are taken as they come and collected into a second buffer bucket by
// bucket, and the logical layout survives a re-layout.
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <memory>
#include <string>

#include "hpc_train/comm/flat_parameters.h"

namespace {

hpc_train::BucketLayout layout_of(const std::vector<std::vector<int>>& groups,
                                  const std::vector<int64_t>& numels, int world) {
  std::vector<hpc_train::Bucket> buckets;
  for (const auto& group : groups) {
    hpc_train::Bucket bucket;
    bucket.parameters = group;
    buckets.push_back(bucket);
  }
  return hpc_train::make_bucket_layout(buckets, numels, world);
}

// `module`'s parameters, in its order, moved into flat storage laid out by `layout`.
hpc_train::FlatParameters flat_of(const torch::nn::Module& module, hpc_train::BucketLayout layout,
                                  bool channels_last_weights = false) {
  std::vector<std::string> names;
  std::vector<at::Tensor> parameters;
  for (const auto& item : module.named_parameters()) {
    names.push_back(item.key());
    parameters.push_back(item.value());
  }
  return hpc_train::FlatParameters(names, parameters, std::move(layout), channels_last_weights);
}

}  // namespace

TEST(FlatParameters, BackwardWritesIntoTheFlatGradientBuffer) {
  torch::manual_seed(1);
  torch::nn::Linear layer(3, 2);  // weight [2,3] (6) then bias [2] (2)
  const torch::Tensor weight_before = layer->weight.detach().clone();
  // Bias first, then weight, world size 3: bias 2 -> padded to 48 (3 x 16); weight 6 -> 48.
  hpc_train::FlatParameters flat = flat_of(*layer, layout_of({{1}, {0}}, {6, 2}, 3));
  ASSERT_EQ(flat.numel(), 8);
  ASSERT_EQ(flat.values().numel(), 96);
  EXPECT_EQ(flat.layout().slots[0].offset, 48);
  // Values moved, not changed; the module now reads the flat buffer.
  EXPECT_TRUE(torch::equal(layer->weight.detach(), weight_before));
  flat.values().narrow(0, 0, 2).fill_(5.0f);
  EXPECT_TRUE(torch::equal(layer->bias.detach(), torch::full({2}, 5.0f)));

  const torch::Tensor x = torch::ones({4, 3});
  layer->forward(x).sum().backward();
  // Autograd's own gradient tensors, not views of the flat buffer (Note [Flat parameter storage]).
  ASSERT_TRUE(layer->bias.grad().defined());
  EXPECT_NE(layer->bias.grad().data_ptr(), flat.grads().data_ptr());
  EXPECT_TRUE(torch::equal(flat.grads(), torch::zeros({96})));
  layer->forward(x).sum().backward();  // accumulates in .grad
  flat.collect_grads(0);               // the bias's bucket
  EXPECT_FALSE(layer->bias.grad().defined()) << "collected gradients are let go";
  EXPECT_TRUE(layer->weight.grad().defined()) << "the weight's bucket is not collected yet";
  flat.collect_grads(1);
  flat.collect_grads(1);  // nothing left: adds nothing
  // d(sum)/d(bias) = batch size; d(sum)/d(weight) = sum of inputs = 4, twice; padding stays 0.
  const torch::Tensor expected = torch::cat({torch::full({2}, 4.f), torch::zeros({46}),
                                             torch::full({6}, 4.f), torch::zeros({42})});
  EXPECT_TRUE(torch::equal(flat.grads(), expected * 2));
  layer->forward(x).sum().backward();
  flat.collect_grads(0);
  flat.collect_grads(1);
  EXPECT_TRUE(torch::equal(flat.grads(), expected * 3)) << "collected onto what is there";
  layer->forward(x).sum().backward();
  flat.zero_grads();
  EXPECT_TRUE(torch::equal(flat.grads(), torch::zeros({96})));
  EXPECT_FALSE(layer->weight.grad().defined()) << "zero_grads drops what was not collected";
}

namespace {

// Counts, on every thread, the ATen operators other than views that run inside autograd's
// AccumulateGrad (an add into an existing .grad, or a copy of a gradient that cannot be taken as
// it is), and the multi-tensor adds outside it.
struct AccumulationOps {
  static inline std::atomic<int> inside_accumulate_grad{0};
  static inline std::atomic<int> foreach_adds{0};
  static inline thread_local int depth = 0;  // AccumulateGrad scopes open on this thread

  static bool is_accumulate_grad(const at::RecordFunction& fn) {
    return std::string(fn.name()).find("AccumulateGrad") != std::string::npos;
  }
  static std::unique_ptr<at::ObserverContext> start(const at::RecordFunction& fn) {
    if (is_accumulate_grad(fn)) {
      ++depth;
    } else if (depth > 0) {
      // Taking a gradient is a detach, a view without a kernel; anything else computes.
      if (std::string(fn.name()).find("detach") == std::string::npos) ++inside_accumulate_grad;
    } else if (std::string(fn.name()) == "aten::_foreach_add_") {
      ++foreach_adds;
    }
    return nullptr;
  }
  static void end(const at::RecordFunction& fn, at::ObserverContext*) {
    if (is_accumulate_grad(fn)) --depth;
  }
};

}  // namespace

// The point of Note [Flat parameter storage]: no kernel per parameter. Backward only hands its
// gradients over, and a bucket's collection is one multi-tensor add. (Before, each parameter's
// gradient was added into a view of the flat buffer inside AccumulateGrad.)
TEST(FlatParameters, BackwardRunsNoOperatorPerParameter) {
  torch::manual_seed(3);
  torch::nn::Sequential model(torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 4, 3).padding(1)),
                              torch::nn::ReLU(), torch::nn::Flatten(), torch::nn::Linear(64, 5));
  hpc_train::FlatParameters flat = flat_of(*model, layout_of({{3, 2}, {1, 0}}, {72, 4, 320, 5}, 2));
  const torch::Tensor x = torch::randn({3, 2, 4, 4});
  const at::CallbackHandle handle = at::addGlobalCallback(
      at::RecordFunctionCallback(&AccumulationOps::start, &AccumulationOps::end)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  model->forward(x).square().sum().backward();
  flat.collect_grads(0);
  flat.collect_grads(1);
  at::removeCallback(handle);
  EXPECT_EQ(AccumulationOps::inside_accumulate_grad.load(), 0);
  EXPECT_EQ(AccumulationOps::foreach_adds.load(), 2);
  // And the gradients are right: those of a plain copy of the model.
  torch::nn::Sequential reference(torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 4, 3).padding(1)),
                                  torch::nn::ReLU(), torch::nn::Flatten(),
                                  torch::nn::Linear(64, 5));
  std::vector<torch::Tensor> reference_grads;
  {
    torch::NoGradGuard no_grad;
    const std::vector<torch::Tensor> parameters = model->parameters();
    for (size_t i = 0; i < parameters.size(); ++i)
      reference->parameters()[i].copy_(parameters[i]);
  }
  reference->forward(x).square().sum().backward();
  for (const torch::Tensor& p : reference->parameters())
    reference_grads.push_back(p.grad().reshape({-1}));
  EXPECT_TRUE(torch::equal(flat.to_logical(flat.grads()), torch::cat(reference_grads)));
}

TEST(FlatParameters, RelayoutKeepsTheLogicalValues) {
  std::vector<at::Tensor> parameters = {torch::arange(5, torch::kFloat).requires_grad_(),
                                        torch::arange(10, 13, torch::kFloat).requires_grad_()};
  hpc_train::FlatParameters flat({"a", "b"}, parameters, layout_of({{1, 0}}, {5, 3}, 2));
  const torch::Tensor logical = flat.to_logical(flat.values());
  EXPECT_TRUE(torch::equal(logical, torch::tensor({0.f, 1.f, 2.f, 3.f, 4.f, 10.f, 11.f, 12.f})));
  flat.relayout(layout_of({{0}, {1}}, {5, 3}, 4));
  EXPECT_EQ(flat.values().numel(), 128);  // 5 -> 64 (4 x 16), 3 -> 64
  EXPECT_TRUE(torch::equal(flat.to_logical(flat.values()), logical));
  EXPECT_TRUE(torch::equal(parameters[1].detach(), torch::tensor({10.f, 11.f, 12.f})));
  EXPECT_TRUE(torch::equal(flat.from_logical(logical), flat.values()));
}

// Note [Gradient precision], in closed form: micro-steps whose gradients are 256 and then seven
// times 1 (an fp32 loss, as the trainer's, over bf16 parameters). Added up in bf16, as autograd
// does in `.grad`, every 256 + 1 rounds back to 256 (bf16 has 8 significant bits: 2 apart there);
// added up in fp32 they make 263, rounded once (to 264) where the reduction is bf16, kept where
// it is fp32. The fp32 sum survives a re-layout; zero_grads clears it; the bytes are counted.
TEST(FlatParameters, Fp32AccumulationAddsMicroStepsInFp32) {
  using hpc_train::GradientPrecision;
  const auto window = [](GradientPrecision precision, bool relayout_midway) {
    std::vector<at::Tensor> parameters = {
        torch::zeros({3}, torch::kBFloat16).requires_grad_(),
        torch::zeros({2}, torch::kBFloat16).requires_grad_()};
    hpc_train::FlatParameters flat({"a", "b"}, parameters, layout_of({{1}, {0}}, {3, 2}, 1));
    flat.set_gradient_storage(precision);
    for (int k = 0; k < 8; ++k) {
      if (relayout_midway && k == 4) flat.relayout(layout_of({{0, 1}}, {3, 2}, 2));
      const float g = k == 0 ? 256.0f : 1.0f;
      ((parameters[0].to(torch::kFloat) * g).sum() + (parameters[1].to(torch::kFloat) * g).sum())
          .backward();
      // Inside the window the reducer collects only when the sum is fp32; the last one always.
      if (flat.collects_every_micro_step() || k == 7)
        for (size_t b = 0; b < flat.layout().buckets.size(); ++b) flat.collect_grads(b);
    }
    for (size_t b = 0; b < flat.layout().buckets.size(); ++b) flat.finish_accumulation(b);
    return flat;
  };
  const double bf16_263 = torch::tensor(263.0f).to(torch::kBFloat16).item<double>();
  EXPECT_EQ(bf16_263, 264.0);
  struct Case {
    GradientPrecision precision;
    at::ScalarType grad_dtype;
    double sum;
    int bytes_per_element;  // grads(), plus the separate fp32 sum
  };
  const Case cases[] = {{{false, false}, torch::kBFloat16, 256.0, 2},
                        {{true, false}, torch::kBFloat16, bf16_263, 2 + 4},
                        {{false, true}, torch::kFloat, 256.0, 4},
                        {{true, true}, torch::kFloat, 263.0, 4}};
  for (const Case& c : cases) {
    for (bool relayout_midway : {false, true}) {
      const std::string what = std::string("accumulate fp32 ") +
                               (c.precision.accumulate_fp32 ? "yes" : "no") + ", reduce fp32 " +
                               (c.precision.reduce_fp32 ? "yes" : "no") +
                               (relayout_midway ? ", re-laid out" : "");
      hpc_train::FlatParameters flat = window(c.precision, relayout_midway);
      EXPECT_EQ(flat.collects_every_micro_step(), c.precision.accumulate_fp32) << what;
      EXPECT_EQ(flat.grads().scalar_type(), c.grad_dtype) << what;
      EXPECT_TRUE(torch::equal(flat.to_logical(flat.grads()).to(torch::kDouble),
                               torch::full({5}, c.sum, torch::kDouble)))
          << what << ": " << flat.to_logical(flat.grads());
      EXPECT_EQ(flat.gradient_bytes(), flat.layout().total_numel * c.bytes_per_element) << what;
      flat.zero_grads();
      for (size_t b = 0; b < flat.layout().buckets.size(); ++b) flat.finish_accumulation(b);
      EXPECT_TRUE(torch::equal(flat.grads(), torch::zeros_like(flat.grads()))) << what;
    }
  }
  // An fp32 model: both are what happens anyway.
  std::vector<at::Tensor> fp32 = {torch::zeros({3}).requires_grad_()};
  hpc_train::FlatParameters flat({"a"}, fp32, layout_of({{0}}, {3}, 1));
  flat.set_gradient_storage({true, true});
  EXPECT_FALSE(flat.collects_every_micro_step());
  EXPECT_EQ(flat.grads().scalar_type(), torch::kFloat);
  EXPECT_EQ(flat.gradient_bytes(), flat.layout().total_numel * 4);
}

// Note [Channels-last weights]: a convolution's weight is stored [O, kH, kW, I] and seen
// channels-last, its gradient too; values, gradients and the logical layout are the same as
// with contiguous storage (the convolution of a copy of the module, stored as LibTorch made it).
TEST(FlatParameters, ChannelsLastWeightsKeepValuesGradientsAndLogicalOrder) {
  torch::manual_seed(2);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 4, 3).padding(1));  // weight [4,3,3,3]
  torch::nn::Conv2d reference(torch::nn::Conv2dOptions(3, 4, 3).padding(1));
  {
    torch::NoGradGuard no_grad;
    reference->weight.copy_(conv->weight);
    reference->bias.copy_(conv->bias);
  }
  const torch::Tensor logical_before =
      torch::cat({conv->weight.detach().reshape({-1}), conv->bias.detach()});
  hpc_train::FlatParameters flat = flat_of(*conv, layout_of({{1, 0}}, {108, 4}, 2),
                                           /*channels_last_weights=*/true);
  EXPECT_TRUE(conv->weight.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_FALSE(conv->weight.is_contiguous());
  EXPECT_TRUE(conv->bias.is_contiguous());  // not 4-D: as before
  EXPECT_TRUE(torch::equal(conv->weight.detach(), reference->weight.detach()));
  // The slot holds [O, kH, kW, I]: element (o=1, i=2, h=0, w=1) sits at 1*27 + 0*9 + 1*3 + 2.
  const int64_t weight_offset = flat.layout().slots[0].offset;
  EXPECT_EQ(flat.values()[weight_offset + 27 + 3 + 2].item<float>(),
            reference->weight[1][2][0][1].item<float>());
  const torch::Tensor logical = flat.to_logical(flat.values());
  EXPECT_TRUE(torch::equal(logical, logical_before));
  EXPECT_TRUE(torch::equal(flat.from_logical(logical), flat.values()));

  const torch::Tensor x = torch::randn({2, 3, 5, 5}).contiguous(at::MemoryFormat::ChannelsLast);
  for (int pass = 0; pass < 2; ++pass) {  // the second accumulates in .grad
    conv->forward(x).square().sum().backward();
    reference->forward(x).square().sum().backward();
  }
  // Autograd keeps a gradient in its parameter's memory format: collected without a copy.
  EXPECT_EQ(conv->weight.grad().strides(), conv->weight.strides());
  flat.collect_grads(0);
  EXPECT_TRUE(torch::allclose(flat.to_logical(flat.grads()),
                              torch::cat({reference->weight.grad().reshape({-1}),
                                          reference->bias.grad()}),
                              1e-5, 1e-5));
  flat.relayout(layout_of({{0}, {1}}, {108, 4}, 3));  // the logical order survives a re-layout
  EXPECT_TRUE(torch::equal(flat.to_logical(flat.values()), logical_before));
  EXPECT_TRUE(conv->weight.is_contiguous(at::MemoryFormat::ChannelsLast));
}

#include "hpc_train/model/models.h"

#include <torch/torch.h>

#include <array>
#include <functional>
#include <map>
#include <stdexcept>

#include "hpc_train/error.h"
#include "hpc_train/model/model_zoo.h"
#include "hpc_train/model/pool_bias_relu.h"
#include "hpc_train/model/scripted_model.h"

namespace hpc_train {

namespace nn = torch::nn;

namespace zoo {

int64_t conv_output_size(int64_t input, int64_t kernel, int64_t stride, int64_t padding) {
  return (input + 2 * padding - kernel) / stride + 1;
}

double conv_flops(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t out_h,
                  int64_t out_w) {
  return 2.0 * static_cast<double>(out_h * out_w * out_channels) *
         static_cast<double>(in_channels * kernel * kernel);
}

double linear_flops(int64_t in_features, int64_t out_features) {
  return 2.0 * static_cast<double>(in_features) * static_cast<double>(out_features);
}

// Note [torchvision's initialisation]
void initialise_like_torchvision(nn::Module& model, LinearInit linear) {
  // Called from constructors, before a shared_ptr owns the model: its children only (the model
  // itself is none of these layers).
  for (const auto& module : model.modules(/*include_self=*/false)) {
    if (auto* conv = module->as<nn::Conv2d>()) {
      nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
      if (conv->bias.defined()) nn::init::zeros_(conv->bias);
    } else if (auto* norm = module->as<nn::BatchNorm2d>()) {
      nn::init::ones_(norm->weight);
      nn::init::zeros_(norm->bias);
    } else if (auto* fc = module->as<nn::Linear>(); fc && linear == LinearInit::kNormal) {
      nn::init::normal_(fc->weight, 0.0, 0.01);
      nn::init::zeros_(fc->bias);
    }
  }
}

}  // namespace zoo

namespace {

using zoo::conv_flops;
using zoo::linear_flops;

class SimpleCnn : public Model {
 public:
  explicit SimpleCnn(const ModelShape& shape) {
    if (shape.height < 4 || shape.width < 4)
      throw ConfigError("model simple_cnn needs images of at least 4x4 pixels, the dataset has " +
                        std::to_string(shape.height) + "x" + std::to_string(shape.width));
    // Two 2x2 max-pools (floor) shrink each side by 4.
    const int64_t flat_features = 64 * (shape.height / 4) * (shape.width / 4);
    conv1_ = register_module(
        "conv1", nn::Conv2d(nn::Conv2dOptions(shape.channels, 32, 3).padding(kConvPadding)));
    conv2_ = register_module("conv2",
                             nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(kConvPadding)));
    fc1_ = register_module("fc1", nn::Linear(flat_features, 512));
    fc2_ = register_module("fc2", nn::Linear(512, shape.num_classes));
  }

  // The layers of the constructor and forward(), as arithmetic.
  static double forward_flops(const ModelShape& shape) {
    const int64_t h1 = shape.height / 2, w1 = shape.width / 2;  // after the first pool
    const int64_t h2 = h1 / 2, w2 = w1 / 2;                      // after the second
    return conv_flops(shape.channels, 32, 3, shape.height, shape.width) +
           conv_flops(32, 64, 3, h1, w1) + linear_flops(64 * h2 * w2, 512) +
           linear_flops(512, shape.num_classes);
  }

  torch::Tensor forward(const torch::Tensor& images) override {
    auto x = conv_pool_relu(*conv1_, images, at::MemoryFormat::ChannelsLast);
    // NCHW, so that the flatten is a view in PyTorch's order (fc1's weights expect it).
    x = conv_pool_relu(*conv2_, x, at::MemoryFormat::Contiguous);
    x = torch::relu(fc1_->forward(x.flatten(1)));
    return fc2_->forward(x);
  }

 private:
  // Note [Pool before bias]
  // The network is PyTorch's max_pool2d(relu(conv(x) + bias), 2), computed as
  // relu(max_pool2d(conv(x), 2) + bias): the bias's add and the ReLU, and in backward the ReLU's
  // mask and the bias's gradient (a reduction over batch and pixels), then run on the pooled
  // maps, a quarter of the convolution's output. It is the same function with the same
  // gradients: t -> relu(t + bias) does not decrease, so it commutes with a maximum, also in
  // floating point, where adding a constant and rounding does not decrease either. Only where
  // two pixels of a window differ before the bias and tie after it can the gradient go to
  // another one (max pooling sends it to the first maximum). The two bias gradients' reductions
  // over the full maps had been a noticeable share of a step's kernels (bench/results-notes.md,
  // Note [Pool before bias]). On a GPU the three run as one kernel (Note [Fused pooling] in
  // pool_bias_relu.h), whose output is laid out as `pooled_format`.
  static torch::Tensor conv_pool_relu(const nn::Conv2dImpl& conv, const torch::Tensor& x,
                                      at::MemoryFormat pooled_format) {
    return max_pool_bias_relu(
        torch::conv2d(x, conv.weight, /*bias=*/{}, /*stride=*/1, /*padding=*/kConvPadding),
        conv.bias, pooled_format);
  }

  static constexpr int64_t kConvPadding = 1;  // 3x3 convolutions keep the image's size
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  nn::Linear fc1_{nullptr}, fc2_{nullptr};
};

struct RegisteredModel {
  std::function<std::shared_ptr<Model>(const ModelShape&)> make;
  std::function<double(const ModelShape&)> forward_flops;
};

RegisteredModel resnet(zoo::ResidualBlock block, std::array<int64_t, 4> blocks, zoo::ResNetStem stem,
                       zoo::Initialisation init = zoo::Initialisation::kTorchvision) {
  const zoo::ResNetSpec spec{block, blocks, stem, init};
  return {[spec](const ModelShape& s) { return zoo::make_resnet(spec, s); },
          [spec](const ModelShape& s) { return zoo::resnet_forward_flops(spec, s); }};
}

RegisteredModel wide_resnet(int64_t depth, int64_t widen_factor) {
  const zoo::WideResNetSpec spec{depth, widen_factor};
  return {[spec](const ModelShape& s) { return zoo::make_wide_resnet(spec, s); },
          [spec](const ModelShape& s) { return zoo::wide_resnet_forward_flops(spec, s); }};
}

RegisteredModel vgg_bn(zoo::VggConfig config) {
  return {[config](const ModelShape& s) { return zoo::make_vgg_bn(config, s); },
          [config](const ModelShape& s) { return zoo::vgg_bn_forward_flops(config, s); }};
}

// Note [Two ResNet stems]: torchvision's ResNets begin with a 7x7 stride-2 convolution and a
// stride-2 max-pool, made for 224-pixel ImageNet images: on 32-pixel CIFAR images they leave
// 8x8 maps before the first stage and 1x1 at the last. The CIFAR stem (3x3, stride 1, no
// max-pool) keeps 32x32 into the first stage, and every parameter name and shape except conv1's
// kernel. hpc_train's resnet18 has always been the CIFAR variant, and its runs, checkpoints and
// benchmarks use that name, so a bare resnetNN is the CIFAR variant at every depth (resnet18 and
// resnet34 compare like with like) and `_imagenet` marks torchvision's exact network, whose
// weights (torchvision.models.resnetNN) load into it unchanged.
const std::map<std::string, RegisteredModel>& registry() {
  using zoo::ResidualBlock;
  using zoo::ResNetStem;
  static const std::map<std::string, RegisteredModel> models = [] {
    const std::map<std::string, RegisteredModel> built = {
        {"simple_cnn",
         {[](const ModelShape& s) { return std::make_shared<SimpleCnn>(s); }, &SimpleCnn::forward_flops}},
        {"resnet18", resnet(ResidualBlock::kBasic, {2, 2, 2, 2}, ResNetStem::kCifar,
                            zoo::Initialisation::kLibTorchDefault)},
        {"resnet34", resnet(ResidualBlock::kBasic, {3, 4, 6, 3}, ResNetStem::kCifar)},
        {"resnet50", resnet(ResidualBlock::kBottleneck, {3, 4, 6, 3}, ResNetStem::kCifar)},
        {"resnet18_imagenet", resnet(ResidualBlock::kBasic, {2, 2, 2, 2}, ResNetStem::kImageNet)},
        {"resnet34_imagenet", resnet(ResidualBlock::kBasic, {3, 4, 6, 3}, ResNetStem::kImageNet)},
        {"resnet50_imagenet",
         resnet(ResidualBlock::kBottleneck, {3, 4, 6, 3}, ResNetStem::kImageNet)},
        {"wide_resnet16_8", wide_resnet(16, 8)},
        {"vgg11_bn", vgg_bn(zoo::VggConfig::kVgg11)},
        {"vgg16_bn", vgg_bn(zoo::VggConfig::kVgg16)},
    };
    // --help lists model_names() (model_names.h, without LibTorch): the two must name the same
    // models.
    bool same = built.size() == model_names().size();
    for (const std::string& name : model_names()) same = same && built.count(name) == 1;
    if (!same) throw std::logic_error("model_names() and the model registry name different models");
    return built;
  }();
  return models;
}

// The registered model `name`, for a shape it can take; ConfigError otherwise.
const RegisteredModel& find_model(const std::string& name, const ModelShape& shape) {
  const auto it = registry().find(name);
  if (it == registry().end())
    throw ConfigError("--model " + name + ": unknown model; known models: " + model_names_text());
  if (shape.channels < 1 || shape.num_classes < 2)
    throw ConfigError("model " + name + ": the dataset must have at least 1 channel and 2 classes");
  return it->second;
}

}  // namespace

std::shared_ptr<Model> make_model(const std::string& name, const ModelShape& shape) {
  return find_model(name, shape).make(shape);
}

double forward_flops_per_sample(const std::string& name, const ModelShape& shape) {
  return find_model(name, shape).forward_flops(shape);
}

double training_flops_per_sample(const std::string& name, const ModelShape& shape) {
  return kTrainingFlopsPerForwardFlop * forward_flops_per_sample(name, shape);
}

namespace {

// A registry network as a TrainableModel (Note [Two kinds of model]): nn::Module's own tree.
class BuiltinModel final : public TrainableModel {
 public:
  BuiltinModel(std::string name, std::shared_ptr<Model> network, double forward_flops)
      : name_(std::move(name)), network_(std::move(network)), forward_flops_(forward_flops) {}

  torch::Tensor forward(const torch::Tensor& images) override { return network_->forward(images); }

  std::vector<NamedTensor> named_parameters() const override {
    std::vector<NamedTensor> tensors;
    for (const auto& item : network_->named_parameters()) tensors.push_back({item.key(), item.value()});
    return tensors;
  }

  std::vector<NamedTensor> named_buffers() const override {
    std::vector<NamedTensor> tensors;
    for (const auto& item : network_->named_buffers()) tensors.push_back({item.key(), item.value()});
    return tensors;
  }

  void train(bool on) override { network_->train(on); }

  // nn::Module::to casts every buffer, num_batches_tracked included (LibTorch's behaviour,
  // kept as it was: checkpoints of 16-bit runs store that count as F32).
  void to(const torch::Device& device, torch::Dtype dtype) override { network_->to(device, dtype); }

  const std::string& identity() const override { return name_; }

  std::optional<double> forward_flops_per_sample() const override { return forward_flops_; }

 private:
  std::string name_;
  std::shared_ptr<Model> network_;
  double forward_flops_;
};

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

bool names_torchscript_file(const std::string& model) {
  return ends_with(model, ".pt") || ends_with(model, ".pth") ||
         model.find('/') != std::string::npos;
}

std::string libtorch_message(const std::exception& e) {
  const auto first_line = [](const std::string& text) { return text.substr(0, text.find('\n')); };
  if (const auto* error = dynamic_cast<const c10::Error*>(&e))
    return first_line(error->what_without_backtrace());
  return first_line(e.what());
}

torch::Tensor check_runs_in(TrainableModel& model, const torch::Tensor& input,
                            const std::string& precision, const std::string& name) {
  torch::NoGradGuard no_grad;
  model.eval();
  try {
    return model.forward(input);
  } catch (const c10::Error& e) {
    throw ConfigError("--precision " + precision + ": " + name + " cannot run in " + precision +
                      " here (" + libtorch_message(e) +
                      "); use --precision bf16 or fp32 on the CPU, fp16 on a GPU");
  }
}

std::unique_ptr<TrainableModel> load_model(const std::string& model, const ModelShape& shape) {
  if (names_torchscript_file(model)) return load_scripted_model(model, shape);
  return std::make_unique<BuiltinModel>(model, make_model(model, shape),
                                        forward_flops_per_sample(model, shape));
}

}  // namespace hpc_train

#include "hpc_train/models.h"

#include <torch/torch.h>

#include <functional>
#include <map>

#include "hpc_train/error.h"

namespace hpc_train {

namespace nn = torch::nn;

namespace {

nn::Conv2dOptions conv3x3(int64_t in, int64_t out, int64_t stride = 1) {
  return nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false);
}

class SimpleCnn : public Model {
 public:
  explicit SimpleCnn(const ModelShape& shape) {
    if (shape.height < 4 || shape.width < 4)
      throw ConfigError("model simple_cnn needs images of at least 4x4 pixels, the dataset has " +
                        std::to_string(shape.height) + "x" + std::to_string(shape.width));
    // Two 2x2 max-pools (floor) shrink each side by 4.
    const int64_t flat_features = 64 * (shape.height / 4) * (shape.width / 4);
    conv1_ = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(shape.channels, 32, 3).padding(1)));
    conv2_ = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)));
    fc1_ = register_module("fc1", nn::Linear(flat_features, 512));
    fc2_ = register_module("fc2", nn::Linear(512, shape.num_classes));
  }

  torch::Tensor forward(const torch::Tensor& images) override {
    auto x = torch::max_pool2d(torch::relu(conv1_->forward(images)), 2);
    x = torch::max_pool2d(torch::relu(conv2_->forward(x)), 2);
    x = torch::relu(fc1_->forward(x.flatten(1)));
    return fc2_->forward(x);
  }

 private:
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  nn::Linear fc1_{nullptr}, fc2_{nullptr};
};

// torchvision's BasicBlock: two 3x3 convolutions with batch norm, identity or 1x1 shortcut.
class BasicBlockImpl : public nn::Module {
 public:
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride) {
    conv1_ = register_module("conv1", nn::Conv2d(conv3x3(in, out, stride)));
    bn1_ = register_module("bn1", nn::BatchNorm2d(out));
    conv2_ = register_module("conv2", nn::Conv2d(conv3x3(out, out)));
    bn2_ = register_module("bn2", nn::BatchNorm2d(out));
    if (stride != 1 || in != out) {
      downsample_ = register_module(
          "downsample",
          nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
                         nn::BatchNorm2d(out)));
    }
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto y = torch::relu(bn1_->forward(conv1_->forward(x)));
    y = bn2_->forward(conv2_->forward(y));
    return torch::relu(y + (downsample_ ? downsample_->forward(x) : x));
  }

 private:
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
  nn::Sequential downsample_{nullptr};
};
TORCH_MODULE(BasicBlock);

class ResNet18 : public Model {
 public:
  explicit ResNet18(const ModelShape& shape) {
    conv1_ = register_module("conv1", nn::Conv2d(conv3x3(shape.channels, 64)));
    bn1_ = register_module("bn1", nn::BatchNorm2d(64));
    int64_t in = 64;
    const int64_t widths[4] = {64, 128, 256, 512};
    for (int i = 0; i < 4; ++i) {
      nn::Sequential layer;
      layer->push_back(BasicBlock(in, widths[i], i == 0 ? 1 : 2));
      layer->push_back(BasicBlock(widths[i], widths[i], 1));
      layers_[i] = register_module("layer" + std::to_string(i + 1), layer);
      in = widths[i];
    }
    fc_ = register_module("fc", nn::Linear(512, shape.num_classes));
  }

  torch::Tensor forward(const torch::Tensor& images) override {
    auto x = torch::relu(bn1_->forward(conv1_->forward(images)));
    for (auto& layer : layers_) x = layer->forward(x);
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return fc_->forward(x);
  }

 private:
  nn::Conv2d conv1_{nullptr};
  nn::BatchNorm2d bn1_{nullptr};
  nn::Sequential layers_[4] = {nullptr, nullptr, nullptr, nullptr};
  nn::Linear fc_{nullptr};
};

using ModelFactory = std::function<std::shared_ptr<Model>(const ModelShape&)>;

const std::map<std::string, ModelFactory>& registry() {
  static const std::map<std::string, ModelFactory> models = {
      {"simple_cnn", [](const ModelShape& s) { return std::make_shared<SimpleCnn>(s); }},
      {"resnet18", [](const ModelShape& s) { return std::make_shared<ResNet18>(s); }},
  };
  return models;
}

}  // namespace

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& entry : registry()) names.push_back(entry.first);
  return names;
}

std::shared_ptr<Model> make_model(const std::string& name, const ModelShape& shape) {
  const auto it = registry().find(name);
  if (it == registry().end()) {
    std::string known;
    for (const auto& n : model_names()) known += (known.empty() ? "" : ", ") + n;
    throw ConfigError("--model " + name + ": unknown model; known models: " + known);
  }
  if (shape.channels < 1 || shape.num_classes < 2)
    throw ConfigError("model " + name + ": the dataset must have at least 1 channel and 2 classes");
  return it->second(shape);
}

}  // namespace hpc_train

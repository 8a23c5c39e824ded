#include "hpc_train/models.h"

#include <torch/torch.h>

#include <functional>
#include <map>

#include "hpc_train/error.h"
#include "hpc_train/scripted_model.h"

namespace hpc_train {

namespace nn = torch::nn;

namespace {

nn::Conv2dOptions conv3x3(int64_t in, int64_t out, int64_t stride = 1) {
  return nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false);
}

// Counting FLOPs (forward_flops_per_sample): 2 per multiply-accumulate.
int64_t conv_output_size(int64_t input, int64_t kernel, int64_t stride, int64_t padding) {
  return (input + 2 * padding - kernel) / stride + 1;
}

// A square `kernel` convolution whose output is out_h x out_w x out_channels.
double conv_flops(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t out_h,
                  int64_t out_w) {
  return 2.0 * static_cast<double>(out_h * out_w * out_channels) *
         static_cast<double>(in_channels * kernel * kernel);
}

double linear_flops(int64_t in_features, int64_t out_features) {
  return 2.0 * static_cast<double>(in_features) * static_cast<double>(out_features);
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

  // The layers of the constructor and forward(), as arithmetic.
  static double forward_flops(const ModelShape& shape) {
    const int64_t h1 = shape.height / 2, w1 = shape.width / 2;  // after the first pool
    const int64_t h2 = h1 / 2, w2 = w1 / 2;                      // after the second
    return conv_flops(shape.channels, 32, 3, shape.height, shape.width) +
           conv_flops(32, 64, 3, h1, w1) + linear_flops(64 * h2 * w2, 512) +
           linear_flops(512, shape.num_classes);
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

  // The layers of the constructor and BasicBlock, as arithmetic.
  static double forward_flops(const ModelShape& shape) {
    int64_t h = shape.height, w = shape.width, in = 64;
    double flops = conv_flops(shape.channels, 64, 3, h, w);
    for (int i = 0; i < 4; ++i) {
      const int64_t width = 64 << i, stride = i == 0 ? 1 : 2;
      h = conv_output_size(h, 3, stride, 1);
      w = conv_output_size(w, 3, stride, 1);
      flops += conv_flops(in, width, 3, h, w) + conv_flops(width, width, 3, h, w);  // block 1
      if (stride != 1 || in != width) flops += conv_flops(in, width, 1, h, w);     // shortcut
      flops += 2 * conv_flops(width, width, 3, h, w);                               // block 2
      in = width;
    }
    return flops + linear_flops(512, shape.num_classes);
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

struct RegisteredModel {
  std::function<std::shared_ptr<Model>(const ModelShape&)> make;
  std::function<double(const ModelShape&)> forward_flops;
};

const std::map<std::string, RegisteredModel>& registry() {
  static const std::map<std::string, RegisteredModel> models = {
      {"simple_cnn",
       {[](const ModelShape& s) { return std::make_shared<SimpleCnn>(s); }, &SimpleCnn::forward_flops}},
      {"resnet18",
       {[](const ModelShape& s) { return std::make_shared<ResNet18>(s); }, &ResNet18::forward_flops}},
  };
  return models;
}

// The registered model `name`, for a shape it can take; ConfigError otherwise.
const RegisteredModel& find_model(const std::string& name, const ModelShape& shape) {
  const auto it = registry().find(name);
  if (it == registry().end()) {
    std::string known;
    for (const auto& entry : registry()) known += (known.empty() ? "" : ", ") + entry.first;
    throw ConfigError("--model " + name + ": unknown model; known models: " + known);
  }
  if (shape.channels < 1 || shape.num_classes < 2)
    throw ConfigError("model " + name + ": the dataset must have at least 1 channel and 2 classes");
  return it->second;
}

}  // namespace

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& entry : registry()) names.push_back(entry.first);
  return names;
}

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

std::unique_ptr<TrainableModel> load_model(const std::string& model, const ModelShape& shape) {
  if (names_torchscript_file(model)) return load_scripted_model(model, shape);
  return std::make_unique<BuiltinModel>(model, make_model(model, shape),
                                        forward_flops_per_sample(model, shape));
}

}  // namespace hpc_train

// The VGG family of the model zoo (model_zoo.h): torchvision's vgg11_bn and vgg16_bn
// (torchvision/models/vgg.py), with its module names, Sequential indices and initialisation, so
// that a state_dict moves between the two unchanged; tests/test_model_zoo.cpp checks both
// against PyTorch.
#include <torch/torch.h>

#include <string>
#include <vector>

#include "hpc_train/error.h"
#include "hpc_train/model/model_zoo.h"

namespace hpc_train::zoo {

namespace nn = torch::nn;

namespace {

// torchvision's cfgs: a number is a padded 3x3 convolution to that many channels followed by
// batch norm and ReLU (three entries of `features`), kMaxPool a 2x2 max-pool of stride 2 (one).
constexpr int64_t kMaxPool = 0;
const std::vector<int64_t>& layer_config(VggConfig config) {
  static const std::vector<int64_t> vgg11 = {64,  kMaxPool, 128, kMaxPool, 256, 256, kMaxPool,
                                             512, 512,      kMaxPool, 512, 512, kMaxPool};
  static const std::vector<int64_t> vgg16 = {64,  64,  kMaxPool, 128, 128, kMaxPool,
                                             256, 256, 256,      kMaxPool, 512, 512,
                                             512, kMaxPool, 512, 512, 512, kMaxPool};
  return config == VggConfig::kVgg11 ? vgg11 : vgg16;
}

std::string model_name(VggConfig config) {
  return config == VggConfig::kVgg11 ? "vgg11_bn" : "vgg16_bn";
}

// The classifier always sees 512 x 7 x 7 features: torchvision's adaptive average pool to 7x7
// repeats each value of a smaller map (1x1 for 32x32 images) and averages a larger one, so the
// parameter shapes do not depend on the image size.
constexpr int64_t kPooledSide = 7;
constexpr int64_t kClassifierFeatures = 512 * kPooledSide * kPooledSide;
constexpr int64_t kHiddenFeatures = 4096;
constexpr double kDropout = 0.5;

// Five max-pools halve each side five times; a 2x2 pool of a 1-pixel side leaves nothing.
constexpr int64_t kMinimumSide = 32;

void check_image_size(VggConfig config, const ModelShape& shape) {
  if (shape.height < kMinimumSide || shape.width < kMinimumSide)
    throw ConfigError("model " + model_name(config) + " needs images of at least 32x32 pixels " +
                      "(five 2x2 max-pools), the dataset has " + std::to_string(shape.height) +
                      "x" + std::to_string(shape.width));
}

class VggBn : public Model {
 public:
  VggBn(VggConfig config, const ModelShape& shape) {
    check_image_size(config, shape);
    nn::Sequential features;
    int64_t in = shape.channels;
    for (const int64_t channels : layer_config(config)) {
      if (channels == kMaxPool) {
        features->push_back(nn::MaxPool2d(nn::MaxPool2dOptions(2).stride(2)));
        continue;
      }
      features->push_back(nn::Conv2d(nn::Conv2dOptions(in, channels, 3).padding(1)));
      features->push_back(nn::BatchNorm2d(channels));
      features->push_back(nn::ReLU(nn::ReLUOptions(/*inplace=*/true)));
      in = channels;
    }
    features_ = register_module("features", features);
    // Dropout modules follow train() / eval(): active in training steps, off in evaluation.
    classifier_ = register_module(
        "classifier",
        nn::Sequential(nn::Linear(kClassifierFeatures, kHiddenFeatures),
                       nn::ReLU(nn::ReLUOptions(true)), nn::Dropout(kDropout),
                       nn::Linear(kHiddenFeatures, kHiddenFeatures),
                       nn::ReLU(nn::ReLUOptions(true)), nn::Dropout(kDropout),
                       nn::Linear(kHiddenFeatures, shape.num_classes)));
    initialise_like_torchvision(*this, LinearInit::kNormal);
  }

  torch::Tensor forward(const torch::Tensor& images) override {
    auto x = features_->forward(images);
    x = torch::adaptive_avg_pool2d(x, {kPooledSide, kPooledSide}).flatten(1);
    return classifier_->forward(x);
  }

 private:
  nn::Sequential features_{nullptr}, classifier_{nullptr};
};

}  // namespace

std::shared_ptr<Model> make_vgg_bn(VggConfig config, const ModelShape& shape) {
  return std::make_shared<VggBn>(config, shape);
}

// The layers of VggBn, as arithmetic.
double vgg_bn_forward_flops(VggConfig config, const ModelShape& shape) {
  check_image_size(config, shape);
  int64_t h = shape.height, w = shape.width, in = shape.channels;
  double flops = 0;
  for (const int64_t channels : layer_config(config)) {
    if (channels == kMaxPool) {
      h = conv_output_size(h, 2, 2, 0);
      w = conv_output_size(w, 2, 2, 0);
      continue;
    }
    flops += conv_flops(in, channels, 3, h, w);  // padded: the size stays
    in = channels;
  }
  return flops + linear_flops(kClassifierFeatures, kHiddenFeatures) +
         linear_flops(kHiddenFeatures, kHiddenFeatures) +
         linear_flops(kHiddenFeatures, shape.num_classes);
}

}  // namespace hpc_train::zoo

// The networks behind the model registry (models.h), one family per source file, and what the
// families share: the FLOP arithmetic and torchvision's initialisation. models.cpp maps the
// registry's names onto these; the rest of the program sees only models.h.
#pragma once

#include <torch/nn/module.h>

#include <array>
#include <cstdint>
#include <memory>

#include "hpc_train/model/models.h"

namespace hpc_train::zoo {

// --- Counting FLOPs (forward_flops_per_sample): 2 per multiply-accumulate.

// One side of a convolution's (or pooling's) output, as PyTorch computes it (floor).
int64_t conv_output_size(int64_t input, int64_t kernel, int64_t stride, int64_t padding);
// A square `kernel` convolution whose output is out_h x out_w x out_channels.
double conv_flops(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t out_h,
                  int64_t out_w);
double linear_flops(int64_t in_features, int64_t out_features);

// --- Initialisation.
//
// Note [torchvision's initialisation]: the zoo's networks start from the weights torchvision's
// constructors draw, so that training from scratch here starts where torchvision starts (not
// the same numbers, the same distributions): every convolution He-normal over its fan-out
// (kaiming_normal_, mode fan_out, ReLU gain) with zero bias, every batch norm weight 1 and bias 0;
// linear layers keep PyTorch's default (ResNets) or are N(0, 0.01) with zero bias (VGG).
// resnet18 and simple_cnn predate the zoo and keep LibTorch's defaults, so that their runs,
// checkpoints and benchmarks stay comparable with earlier ones.
enum class LinearInit { kPyTorchDefault, kNormal };
void initialise_like_torchvision(torch::nn::Module& model, LinearInit linear);

// --- ResNets (models_resnet.cpp): torchvision's ResNet, with its stem or a CIFAR one.

enum class ResNetStem {
  kImageNet,  // torchvision's: 7x7 stride-2 convolution, batch norm, ReLU, 3x3 stride-2 max-pool
  kCifar,     // 3x3 stride-1 convolution, batch norm, ReLU, no max-pool (same parameter names)
};
enum class ResidualBlock {
  kBasic,       // two 3x3 convolutions (ResNet-18/34)
  kBottleneck,  // 1x1, 3x3 (with the stride, as torchvision's "v1.5"), 1x1 x4 (ResNet-50)
};
enum class Initialisation { kLibTorchDefault, kTorchvision };

struct ResNetSpec {
  ResidualBlock block = ResidualBlock::kBasic;
  std::array<int64_t, 4> blocks = {2, 2, 2, 2};  // blocks of layer1..layer4
  ResNetStem stem = ResNetStem::kImageNet;
  Initialisation init = Initialisation::kTorchvision;
};

std::shared_ptr<Model> make_resnet(const ResNetSpec& spec, const ModelShape& shape);
double resnet_forward_flops(const ResNetSpec& spec, const ModelShape& shape);

// The wide ResNet of Zagoruyko & Komodakis for CIFAR, WRN-depth-k (models_resnet.cpp; the
// structure and its names are described there).
struct WideResNetSpec {
  int64_t depth = 16;        // 6n + 4: n pre-activation blocks in each of 3 stages
  int64_t widen_factor = 8;  // stage widths 16k, 32k, 64k
};

std::shared_ptr<Model> make_wide_resnet(const WideResNetSpec& spec, const ModelShape& shape);
double wide_resnet_forward_flops(const WideResNetSpec& spec, const ModelShape& shape);

// --- VGG with batch norm (models_vgg.cpp): torchvision's vgg11_bn and vgg16_bn.

enum class VggConfig { kVgg11, kVgg16 };  // torchvision's cfgs "A" and "D"

// Both throw ConfigError for images under 32x32 pixels (five 2x2 max-pools).
std::shared_ptr<Model> make_vgg_bn(VggConfig config, const ModelShape& shape);
double vgg_bn_forward_flops(VggConfig config, const ModelShape& shape);

}  // namespace hpc_train::zoo

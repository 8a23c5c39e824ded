// The ResNet family of the model zoo (model_zoo.h): torchvision's ResNet-18/34/50 with its
// ImageNet stem or a CIFAR stem, and the wide ResNet of Zagoruyko & Komodakis for CIFAR.
//
// Module and parameter names, and the order in which modules are registered (which is the
// state_dict's order), are torchvision's (torchvision/models/resnet.py), so that a state_dict
// moves between the two unchanged; tests/test_model_zoo.cpp checks both against PyTorch.
#include <torch/torch.h>

#include <stdexcept>
#include <string>

#include "hpc_train/model/batch_norm_act.h"
#include "hpc_train/model/model_zoo.h"

namespace hpc_train::zoo {

namespace nn = torch::nn;

namespace {

nn::Conv2dOptions conv3x3(int64_t in, int64_t out, int64_t stride = 1) {
  return nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false);
}

nn::Conv2dOptions conv1x1(int64_t in, int64_t out, int64_t stride = 1) {
  return nn::Conv2dOptions(in, out, 1).stride(stride).bias(false);
}

// torchvision's `downsample`: the shortcut's 1x1 convolution and batch norm, where a block
// changes the resolution or the width.
nn::Sequential projection(int64_t in, int64_t out, int64_t stride) {
  return nn::Sequential(nn::Conv2d(conv1x1(in, out, stride)), nn::BatchNorm2d(out));
}

// A block's shortcut: the identity, or the projection's convolution and batch norm.
torch::Tensor shortcut(const nn::Sequential& downsample, const torch::Tensor& x) {
  if (!downsample) return x;
  return batch_norm_act(downsample->ptr(0)->as<nn::Conv2dImpl>()->forward(x),
                        *downsample->ptr(1)->as<nn::BatchNorm2dImpl>(), {}, Activation::kNone);
}

// relu(bn(x)), relu(bn(x) + residual) (batch_norm_act.h: fused on a GPU).
torch::Tensor bn_relu(nn::BatchNorm2d& bn, const torch::Tensor& x,
                      const torch::Tensor& residual = {}) {
  return batch_norm_act(x, *bn, residual, Activation::kRelu);
}

// torchvision's BasicBlock: two 3x3 convolutions with batch norm, identity or 1x1 shortcut.
class BasicBlockImpl : public nn::Module {
 public:
  static constexpr int64_t kExpansion = 1;

  BasicBlockImpl(int64_t in, int64_t planes, int64_t stride) {
    conv1_ = register_module("conv1", nn::Conv2d(conv3x3(in, planes, stride)));
    bn1_ = register_module("bn1", nn::BatchNorm2d(planes));
    conv2_ = register_module("conv2", nn::Conv2d(conv3x3(planes, planes)));
    bn2_ = register_module("bn2", nn::BatchNorm2d(planes));
    if (stride != 1 || in != planes)
      downsample_ = register_module("downsample", projection(in, planes, stride));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor y = bn_relu(bn1_, conv1_->forward(x));
    return bn_relu(bn2_, conv2_->forward(y), shortcut(downsample_, x));
  }

 private:
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
  nn::Sequential downsample_{nullptr};
};
TORCH_MODULE(BasicBlock);

// torchvision's Bottleneck: 1x1 down to `planes`, 3x3 (carrying the stride: torchvision's
// "ResNet v1.5", where the paper strides the first 1x1), 1x1 up to 4 x planes.
class BottleneckImpl : public nn::Module {
 public:
  static constexpr int64_t kExpansion = 4;

  BottleneckImpl(int64_t in, int64_t planes, int64_t stride) {
    const int64_t out = planes * kExpansion;
    conv1_ = register_module("conv1", nn::Conv2d(conv1x1(in, planes)));
    bn1_ = register_module("bn1", nn::BatchNorm2d(planes));
    conv2_ = register_module("conv2", nn::Conv2d(conv3x3(planes, planes, stride)));
    bn2_ = register_module("bn2", nn::BatchNorm2d(planes));
    conv3_ = register_module("conv3", nn::Conv2d(conv1x1(planes, out)));
    bn3_ = register_module("bn3", nn::BatchNorm2d(out));
    if (stride != 1 || in != out)
      downsample_ = register_module("downsample", projection(in, out, stride));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto y = bn_relu(bn1_, conv1_->forward(x));
    y = bn_relu(bn2_, conv2_->forward(y));
    return bn_relu(bn3_, conv3_->forward(y), shortcut(downsample_, x));
  }

 private:
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, conv3_{nullptr};
  nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr}, bn3_{nullptr};
  nn::Sequential downsample_{nullptr};
};
TORCH_MODULE(Bottleneck);

int64_t expansion(ResidualBlock block) {
  return block == ResidualBlock::kBasic ? BasicBlockImpl::kExpansion : BottleneckImpl::kExpansion;
}

// Stage i (layer1..layer4) has 64 x 2^i planes; the first block of stages 2-4 halves the
// resolution.
int64_t stage_planes(int stage) { return int64_t{64} << stage; }
int64_t block_stride(int stage, int64_t block) { return stage > 0 && block == 0 ? 2 : 1; }

// torchvision's ResNet. The stem's ReLU and max-pool and the average pool are functions here,
// not modules: they hold no state, so the state_dict is the same.
class ResNet : public Model {
 public:
  ResNet(const ResNetSpec& spec, const ModelShape& shape) : stem_(spec.stem) {
    conv1_ = register_module(
        "conv1", nn::Conv2d(spec.stem == ResNetStem::kImageNet
                                ? nn::Conv2dOptions(shape.channels, 64, 7).stride(2).padding(3).bias(false)
                                : conv3x3(shape.channels, 64)));
    bn1_ = register_module("bn1", nn::BatchNorm2d(64));
    int64_t in = 64;
    for (int stage = 0; stage < 4; ++stage) {
      const int64_t planes = stage_planes(stage);
      nn::Sequential layer;
      for (int64_t block = 0; block < spec.blocks[stage]; ++block) {
        const int64_t stride = block_stride(stage, block);
        if (spec.block == ResidualBlock::kBasic)
          layer->push_back(BasicBlock(in, planes, stride));
        else
          layer->push_back(Bottleneck(in, planes, stride));
        in = planes * expansion(spec.block);
      }
      layers_[stage] = register_module("layer" + std::to_string(stage + 1), layer);
    }
    fc_ = register_module("fc", nn::Linear(in, shape.num_classes));
    if (spec.init == Initialisation::kTorchvision)
      initialise_like_torchvision(*this, LinearInit::kPyTorchDefault);
  }

  torch::Tensor forward(const torch::Tensor& images) override {
    auto x = bn_relu(bn1_, conv1_->forward(images));
    if (stem_ == ResNetStem::kImageNet) x = torch::max_pool2d(x, 3, 2, 1);
    for (auto& layer : layers_) x = layer->forward(x);
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return fc_->forward(x);
  }

 private:
  ResNetStem stem_;
  nn::Conv2d conv1_{nullptr};
  nn::BatchNorm2d bn1_{nullptr};
  nn::Sequential layers_[4] = {nullptr, nullptr, nullptr, nullptr};
  nn::Linear fc_{nullptr};
};

// The wide ResNet's block: pre-activation (batch norm and ReLU before each convolution), as in
// the paper's Figure 1(a)-(b) and the authors' code. Where the width or resolution changes, the
// shortcut is a 1x1 convolution of the activated input (no batch norm of its own); elsewhere the
// identity of the block's input.
class WideBlockImpl : public nn::Module {
 public:
  WideBlockImpl(int64_t in, int64_t out, int64_t stride) {
    bn1_ = register_module("bn1", nn::BatchNorm2d(in));
    conv1_ = register_module("conv1", nn::Conv2d(conv3x3(in, out, stride)));
    bn2_ = register_module("bn2", nn::BatchNorm2d(out));
    conv2_ = register_module("conv2", nn::Conv2d(conv3x3(out, out)));
    if (stride != 1 || in != out)
      downsample_ = register_module("downsample", nn::Sequential(nn::Conv2d(conv1x1(in, out, stride))));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor activated = bn_relu(bn1_, x);
    auto y = conv1_->forward(activated);
    y = conv2_->forward(bn_relu(bn2_, y));
    return y + (downsample_ ? downsample_->forward(activated) : x);
  }

 private:
  nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  nn::Sequential downsample_{nullptr};
};
TORCH_MODULE(WideBlock);

int64_t wide_blocks_per_stage(const WideResNetSpec& spec) {
  if (spec.depth < 10 || (spec.depth - 4) % 6 != 0)
    throw std::logic_error("a wide ResNet's depth is 6n + 4, not " + std::to_string(spec.depth));
  return (spec.depth - 4) / 6;
}

// WRN-depth-k for CIFAR (Zagoruyko & Komodakis, "Wide Residual Networks", 2016, Table 1):
//   conv1     3x3 convolution C -> 16, stride 1, no bias
//   layer1    n blocks 16k wide at full resolution (the first: 16 -> 16k, 1x1 shortcut)
//   layer2    n blocks 32k wide, the first with stride 2
//   layer3    n blocks 64k wide, the first with stride 2
//   bn        batch norm of the last block's sum (pre-activation leaves it un-normalised), ReLU
//   fc        global average pool (the paper's 8x8 pool on 32x32 images), linear -> classes
// with n = (depth - 4) / 6 and no dropout. torchvision has no wide ResNet of this kind (its
// wide_resnet50_2 is a widened ResNet-50 Bottleneck network), so the names follow torchvision's
// ResNet wherever it has the part: conv1, layerN.M.{bn1,conv1,bn2,conv2}, the shortcut as
// downsample.0 (torchvision's index of the shortcut convolution), fc. The final batch norm,
// which torchvision's post-activation ResNets lack, is `bn`, as in the authors' code.
// bench/reference/models.py has the same network in PyTorch.
class WideResNet : public Model {
 public:
  WideResNet(const WideResNetSpec& spec, const ModelShape& shape) {
    const int64_t blocks = wide_blocks_per_stage(spec);
    conv1_ = register_module("conv1", nn::Conv2d(conv3x3(shape.channels, 16)));
    int64_t in = 16;
    for (int stage = 0; stage < 3; ++stage) {
      const int64_t width = (int64_t{16} << stage) * spec.widen_factor;
      nn::Sequential layer;
      for (int64_t block = 0; block < blocks; ++block) {
        layer->push_back(WideBlock(in, width, block_stride(stage, block)));
        in = width;
      }
      layers_[stage] = register_module("layer" + std::to_string(stage + 1), layer);
    }
    bn_ = register_module("bn", nn::BatchNorm2d(in));
    fc_ = register_module("fc", nn::Linear(in, shape.num_classes));
    initialise_like_torchvision(*this, LinearInit::kPyTorchDefault);
  }

  torch::Tensor forward(const torch::Tensor& images) override {
    auto x = conv1_->forward(images);
    for (auto& layer : layers_) x = layer->forward(x);
    x = bn_relu(bn_, x);
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return fc_->forward(x);
  }

 private:
  nn::Conv2d conv1_{nullptr};
  nn::Sequential layers_[3] = {nullptr, nullptr, nullptr};
  nn::BatchNorm2d bn_{nullptr};
  nn::Linear fc_{nullptr};
};

}  // namespace

std::shared_ptr<Model> make_resnet(const ResNetSpec& spec, const ModelShape& shape) {
  return std::make_shared<ResNet>(spec, shape);
}

// The layers of ResNet and its blocks, as arithmetic.
double resnet_forward_flops(const ResNetSpec& spec, const ModelShape& shape) {
  int64_t h = shape.height, w = shape.width;
  double flops = 0;
  if (spec.stem == ResNetStem::kImageNet) {
    h = conv_output_size(h, 7, 2, 3);
    w = conv_output_size(w, 7, 2, 3);
    flops += conv_flops(shape.channels, 64, 7, h, w);
    h = conv_output_size(h, 3, 2, 1);  // the max-pool
    w = conv_output_size(w, 3, 2, 1);
  } else {
    flops += conv_flops(shape.channels, 64, 3, h, w);
  }
  int64_t in = 64;
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t planes = stage_planes(stage), out = planes * expansion(spec.block);
    for (int64_t block = 0; block < spec.blocks[stage]; ++block) {
      const int64_t stride = block_stride(stage, block);
      const int64_t out_h = conv_output_size(h, 3, stride, 1), out_w = conv_output_size(w, 3, stride, 1);
      if (spec.block == ResidualBlock::kBasic) {
        flops += conv_flops(in, planes, 3, out_h, out_w) + conv_flops(planes, planes, 3, out_h, out_w);
      } else {
        flops += conv_flops(in, planes, 1, h, w) + conv_flops(planes, planes, 3, out_h, out_w) +
                 conv_flops(planes, out, 1, out_h, out_w);
      }
      // The 1x1 shortcut of stride s covers the same output as the padded 3x3 of stride s.
      if (stride != 1 || in != out) flops += conv_flops(in, out, 1, out_h, out_w);
      in = out;
      h = out_h;
      w = out_w;
    }
  }
  return flops + linear_flops(in, shape.num_classes);
}

std::shared_ptr<Model> make_wide_resnet(const WideResNetSpec& spec, const ModelShape& shape) {
  return std::make_shared<WideResNet>(spec, shape);
}

// The layers of WideResNet and WideBlock, as arithmetic.
double wide_resnet_forward_flops(const WideResNetSpec& spec, const ModelShape& shape) {
  const int64_t blocks = wide_blocks_per_stage(spec);
  int64_t h = shape.height, w = shape.width, in = 16;
  double flops = conv_flops(shape.channels, 16, 3, h, w);
  for (int stage = 0; stage < 3; ++stage) {
    const int64_t width = (int64_t{16} << stage) * spec.widen_factor;
    for (int64_t block = 0; block < blocks; ++block) {
      const int64_t stride = block_stride(stage, block);
      h = conv_output_size(h, 3, stride, 1);
      w = conv_output_size(w, 3, stride, 1);
      flops += conv_flops(in, width, 3, h, w) + conv_flops(width, width, 3, h, w);
      if (stride != 1 || in != width) flops += conv_flops(in, width, 1, h, w);
      in = width;
    }
  }
  return flops + linear_flops(in, shape.num_classes);
}

}  // namespace hpc_train::zoo

// The model registry: networks chosen by name and sized from the dataset's shape.
//
//   simple_cnn  the origin's network: conv 3x3 C->32, ReLU, max-pool 2; conv 3x3 32->64, ReLU,
//               max-pool 2; linear -> 512, ReLU; linear -> classes (convolutions padded by 1)
//   resnet18    ResNet-18, CIFAR variant: 3x3 stride-1 stem, no max-pool, BasicBlocks [2,2,2,2]
//
// Parameter names follow the PyTorch definitions in bench/reference/, so that weights can be
// exchanged with PyTorch under the same names.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

namespace hpc_train {

struct ModelShape {
  int64_t channels = 0;
  int64_t height = 0;
  int64_t width = 0;
  int64_t num_classes = 0;
};

class Model : public torch::nn::Module {
 public:
  // float images [B, C, H, W] (normalised) -> logits [B, num_classes]
  virtual torch::Tensor forward(const torch::Tensor& images) = 0;
};

std::vector<std::string> model_names();

// Throws ConfigError for an unknown name (listing the known ones) or a shape the network
// cannot take.
std::shared_ptr<Model> make_model(const std::string& name, const ModelShape& shape);

// Floating-point operations of one sample's forward pass, counted analytically from the
// network's layers (for MFU): 2 per multiply-accumulate of every convolution and linear layer.
// Left out, as negligible: biases, activations, pooling, batch norm and residual additions —
// a few operations per output element, against hundreds to thousands of multiply-accumulates
// per output element in all but the first convolution (well under 1% of the total). Throws
// ConfigError for an unknown name or a shape without channels or classes.
double forward_flops_per_sample(const std::string& name, const ModelShape& shape);

// A training step per sample: forward, plus a backward that computes the gradients of both the
// activations and the weights, each costing about one forward: 3 x the forward (the usual
// convention for MFU).
constexpr double kTrainingFlopsPerForwardFlop = 3.0;
double training_flops_per_sample(const std::string& name, const ModelShape& shape);

}  // namespace hpc_train

// Models: the registry of built-in networks, chosen by name and sized from the dataset's shape
// (its channels and classes; the zoo's networks take any image size, VGG at least 32x32), and the
// trainer's view of any model, built in or a TorchScript file (load_model).
//
//   simple_cnn         the origin's network: conv 3x3 C->32, ReLU, max-pool 2; conv 3x3 32->64,
//                      ReLU, max-pool 2; linear -> 512, ReLU; linear -> classes (padded convs)
//   resnet18           ResNet-18, CIFAR stem: 3x3 stride-1 convolution, no max-pool;
//                      BasicBlocks [2,2,2,2]
//   resnet34           ResNet-34, CIFAR stem; BasicBlocks [3,4,6,3]
//   resnet50           ResNet-50, CIFAR stem; Bottlenecks [3,4,6,3]
//   resnet18_imagenet  torchvision's resnet18, 34 and 50 exactly: 7x7 stride-2 stem and
//   resnet34_imagenet  3x3 stride-2 max-pool (Note [Two ResNet stems] in models.cpp says why
//   resnet50_imagenet  the bare names keep the CIFAR stem)
//   wide_resnet16_8    WRN-16-8 for CIFAR (Zagoruyko & Komodakis): pre-activation blocks, stages
//                      128/256/512 wide, 2 blocks each (models_resnet.cpp describes it)
//   vgg11_bn           torchvision's vgg11_bn and vgg16_bn: 3x3 convolutions with batch norm,
//   vgg16_bn           adaptive average pool to 7x7, classifier 25088 -> 4096 -> 4096 -> classes
//                      with dropout 0.5 (active in training, off in evaluation)
//
// Parameter and buffer names, and their state_dict order, are torchvision's for the networks
// torchvision has (the same module structure: layer1.0.conv1.weight, layer1.0.downsample.0.weight,
// features.0.weight, classifier.6.bias, bn1.num_batches_tracked, ...), and those of the PyTorch
// definitions in bench/reference/models.py for the others, so that weights move both ways under
// the same names. A network whose first layer torchvision fixes at 3 input channels takes the
// dataset's channel count there instead (only that tensor's shape differs). The zoo's networks
// start from torchvision's initialisation (Note [torchvision's initialisation], model_zoo.h);
// simple_cnn and resnet18 keep LibTorch's defaults.
//
// Note [Two kinds of model]
// The trainer sees every model through TrainableModel: forward, its parameters and buffers under
// their state_dict names, train/eval, and a move to the run's device and dtype. Two kinds
// implement it:
//   - the registry's networks: subclasses of Model (a torch::nn::Module with forward(images)),
//     written in C++; load_model wraps one (BuiltinModel in models.cpp);
//   - a module saved from Python with TorchScript (scripted_model.h), over torch::jit::Module.
// Model stays the registry's nn::Module base rather than becoming the interface itself: a
// jit::Module keeps its parameters in a tree of its own that an nn::Module cannot hold, so a
// scripted model would have been an nn::Module with an empty tree behind nn::Module's own
// (non-virtual) parameters(); and the networks stay plain nn::Module code (register_module,
// their own forward), unchanged by the second kind. Everything after load_model (flat
// parameters, reducer hooks, optimizer, broadcasts, checkpoints, evaluation) holds only
// TrainableModel and the tensors it hands out, so both kinds get the same treatment.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hpc_train/model/model_names.h"

namespace hpc_train {

struct ModelShape {
  int64_t channels = 0;
  int64_t height = 0;
  int64_t width = 0;
  int64_t num_classes = 0;
};

// A model as the trainer sees it (Note [Two kinds of model]).
class TrainableModel {
 public:
  struct NamedTensor {
    std::string name;  // the state_dict name, e.g. "layer1.0.bn1.running_mean"
    torch::Tensor tensor;
  };

  virtual ~TrainableModel() = default;

  // float images [B, C, H, W] (normalised, in the model's dtype) -> logits [B, num_classes]
  virtual torch::Tensor forward(const torch::Tensor& images) = 0;
  // The model's own tensors, not copies: set_data and copy_ on them change the model. Every
  // parameter is trained (FlatParameters takes them); buffers are the state the model keeps
  // besides (BatchNorm's running statistics and count). Parameters and then buffers, each in
  // module order, are the model's state_dict as checkpoints and weight files hold it.
  virtual std::vector<NamedTensor> named_parameters() const = 0;
  virtual std::vector<NamedTensor> named_buffers() const = 0;
  // Training mode (BatchNorm uses and updates batch statistics, dropout drops) or eval mode.
  virtual void train(bool on = true) = 0;
  void eval() { train(false); }
  // Moves parameters and buffers to `device`, floating-point ones to `dtype` (a built-in
  // network's integer buffers too: nn::Module::to casts every buffer, see BuiltinModel).
  virtual void to(const torch::Device& device, torch::Dtype dtype) = 0;
  // What checkpoints and weight files record as the model: the registry name, or for a
  // TorchScript file "TorchScript content <16 hex digits>" (Note [TorchScript identity] in
  // torchscript_file.h).
  virtual const std::string& identity() const = 0;
  // Floating-point operations of one sample's forward pass (see forward_flops_per_sample
  // below); nullopt where hpc_train cannot count them (a TorchScript module).
  virtual std::optional<double> forward_flops_per_sample() const = 0;
};

// The registry's networks (Note [Two kinds of model]).
class Model : public torch::nn::Module {
 public:
  // float images [B, C, H, W] (normalised) -> logits [B, num_classes]
  virtual torch::Tensor forward(const torch::Tensor& images) = 0;
};

// --model names a TorchScript file rather than a registry entry when it ends in .pt or .pth or
// holds a '/' (a path).
bool names_torchscript_file(const std::string& model);

// The model of --model for input of `shape`, on the CPU in fp32, in training mode: a registry
// network (make_model below) or a TorchScript file (load_scripted_model in scripted_model.h).
// Throws ConfigError for an unknown registry name, DataError for a TorchScript file that cannot
// be used (each reason named).
std::unique_ptr<TrainableModel> load_model(const std::string& model, const ModelShape& shape);

// LibTorch lacks some kernels for some dtypes on some devices (1.13 has no fp16 convolution on
// the CPU): one forward of `model` on `input` (a batch of its input, on the device and in the
// dtype it will train in) finds out before training. Throws ConfigError saying what to do
// instead of a LibTorch backtrace from the first step; `precision` and `name` are --precision
// and --model as given. Leaves the model in eval mode; returns the forward's output.
torch::Tensor check_runs_in(TrainableModel& model, const torch::Tensor& input,
                            const std::string& precision, const std::string& name);

// LibTorch's message without its C++ backtrace (c10::Error) or TorchScript's source excerpt:
// its first line.
std::string libtorch_message(const std::exception& e);

// Throws ConfigError for an unknown name (listing the known ones) or a shape the network
// cannot take.
std::shared_ptr<Model> make_model(const std::string& name, const ModelShape& shape);

// Floating-point operations of one sample's forward pass, counted analytically from the
// network's layers (for MFU): 2 per multiply-accumulate of every convolution and linear layer.
// Left out, as negligible: biases, activations, pooling, batch norm and residual additions —
// a few operations per output element, against hundreds to thousands of multiply-accumulates
// per output element in all but the first convolution (well under 1% of the total). Throws
// ConfigError for an unknown name or a shape the network cannot take.
double forward_flops_per_sample(const std::string& name, const ModelShape& shape);

// A training step per sample: forward, plus a backward that computes the gradients of both the
// activations and the weights, each costing about one forward: 3 x the forward (the usual
// convention for MFU).
constexpr double kTrainingFlopsPerForwardFlop = 3.0;
double training_flops_per_sample(const std::string& name, const ModelShape& shape);

}  // namespace hpc_train

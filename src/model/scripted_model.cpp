#include "hpc_train/model/scripted_model.h"

#include <ATen/Context.h>
#include <caffe2/serialize/versions.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>
#include <torch/version.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "hpc_train/error.h"
#include "hpc_train/model/torchscript_file.h"

namespace hpc_train {
namespace {

// Probing forward with two images rather than one: a module that drops the batch dimension
// (squeeze) shows it.
constexpr int64_t kProbeBatch = 2;

std::string shape_text(c10::IntArrayRef shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// Note [Scripted module executor]: the module's code runs in TorchScript's interpreter without
// the graph executor's optimisations (GraphOptimizerEnabledGuard(false), thread-local, around
// every call): each operator runs as in eager mode and records its own autograd, as the same
// network written in C++ does. With them, the profiling executor would specialise its plan on
// the first runs (the probe forward on the CPU, then the first steps on the device) and
// re-profile and compile fused kernels when they change, possibly inside the step being
// captured as a CUDA graph; and its fused kernels would round differently from the built-in
// network's. What is lost is the fusion of elementwise operators, whose launches a captured
// step's replay makes cheap anyway.
class ScriptedModel final : public TrainableModel {
 public:
  ScriptedModel(torch::jit::Module module, std::string identity)
      : module_(std::move(module)), identity_(std::move(identity)) {}

  torch::Tensor forward(const torch::Tensor& images) override {
    // Note [Scripted module executor]. load_scripted_model checked that forward returns a tensor
    // (its schema says so).
    torch::jit::GraphOptimizerEnabledGuard interpreted(false);
    return module_.forward({images}).toTensor();
  }

  std::vector<NamedTensor> named_parameters() const override {
    std::vector<NamedTensor> tensors;
    for (const auto& item : module_.named_parameters(/*recurse=*/true))
      tensors.push_back({item.name, item.value});
    return tensors;
  }

  std::vector<NamedTensor> named_buffers() const override {
    std::vector<NamedTensor> tensors;
    for (const auto& item : module_.named_buffers(/*recurse=*/true))
      tensors.push_back({item.name, item.value});
    return tensors;
  }

  void train(bool on) override { module_.train(on); }

  // As PyTorch's nn.Module.to: integral buffers (num_batches_tracked) keep their dtype.
  // set_data keeps each tensor the module's attribute holds, so autograd's view of the
  // parameters and the module's own stay one.
  void to(const torch::Device& device, torch::Dtype dtype) override {
    torch::NoGradGuard no_grad;
    auto move = [&](const torch::Tensor& t) {
      t.set_data(t.to(device, t.is_floating_point() ? dtype : t.scalar_type()));
    };
    for (const auto& item : module_.named_parameters(/*recurse=*/true)) move(item.value);
    for (const auto& item : module_.named_buffers(/*recurse=*/true)) move(item.value);
  }

  const std::string& identity() const override { return identity_; }

  std::optional<double> forward_flops_per_sample() const override { return std::nullopt; }

 private:
  mutable torch::jit::Module module_;  // named_parameters() is const, Module's handles are not
  std::string identity_;
};

// What the zip says, before LibTorch reads it: a clear reason for files that are no TorchScript
// module, and the format versions named for one from a newer PyTorch (LibTorch's own message
// names neither the file nor its own release).
TorchScriptFileInfo check_file(const std::string& path) {
  const std::string what_to_do =
      "save the module with torch.jit.script(model).save(PATH) (or torch.jit.trace)";
  TorchScriptFileInfo info;
  try {
    info = read_torchscript_file_info(path);
  } catch (const DataError& e) {
    throw DataError(std::string(e.what()) + ". --model " + path +
                    " is read as a TorchScript file (it ends in .pt or .pth, or names a path): " +
                    what_to_do);
  }
  if (!info.has_code)
    throw DataError(path + ": a PyTorch file without TorchScript code: torch.save wrote it (a "
                    "state_dict or a pickled nn.Module), which LibTorch cannot run: " +
                    what_to_do + "; weights alone go in with --init-weights FILE.safetensors");
  const int64_t newest = static_cast<int64_t>(caffe2::serialize::kMaxSupportedFileFormatVersion);
  const int64_t oldest = static_cast<int64_t>(caffe2::serialize::kMinSupportedFileFormatVersion);
  if (info.format_version > newest)
    throw DataError(path + ": saved by a newer PyTorch than this hpc_train's LibTorch " +
                    TORCH_VERSION + ": the file's format version is " +
                    std::to_string(info.format_version) + " (its " + info.version_record +
                    " record), LibTorch " + TORCH_VERSION + " reads versions " +
                    std::to_string(oldest) + " to " + std::to_string(newest) +
                    ". Save the module with PyTorch " + TORCH_VERSION +
                    " (the Python package of the LibTorch hpc_train was built with), or build "
                    "hpc_train with a LibTorch at least as new as the PyTorch that saved it");
  if (info.format_version < oldest)
    throw DataError(path + ": file format version " + std::to_string(info.format_version) +
                    " (its " + info.version_record + " record) is older than LibTorch " +
                    TORCH_VERSION + " reads (" + std::to_string(oldest) + " to " +
                    std::to_string(newest) + "); save the module again with a newer PyTorch");
  return info;
}

// "images: Tensor, scale: float" (self left out).
std::string describe_arguments(const std::vector<c10::Argument>& arguments) {
  std::string text;
  for (size_t i = 1; i < arguments.size(); ++i)
    text += (i > 1 ? ", " : "") + arguments[i].name() + ": " + arguments[i].type()->str();
  return text;
}

// forward(self, images: Tensor, <anything with a default>) -> Tensor
void check_forward_signature(const torch::jit::Module& module, const std::string& path) {
  const auto forward = module.find_method("forward");
  if (!forward) {
    std::string methods;
    for (const auto& method : module.get_methods())
      methods += (methods.empty() ? "" : ", ") + method.name();
    throw DataError(path + ": the module has no forward method" +
                    (methods.empty() ? std::string() : " (it has " + methods + ")") +
                    "; hpc_train calls forward(images) and trains its output as logits");
  }
  const c10::FunctionSchema& schema = forward->function().getSchema();
  const std::vector<c10::Argument>& arguments = schema.arguments();  // self first
  size_t required = 0;
  for (size_t i = 1; i < arguments.size(); ++i)
    if (!arguments[i].default_value()) ++required;
  if (arguments.size() < 2 || required > 1 ||
      arguments[1].type()->kind() != c10::TypeKind::TensorType)
    throw DataError(path + ": forward takes (" + describe_arguments(arguments) +
                    "); hpc_train calls forward(images) with one tensor, a float batch "
                    "[batch, channels, height, width]");
  if (schema.returns().size() != 1 ||
      schema.returns()[0].type()->kind() != c10::TypeKind::TensorType)
    throw DataError(path + ": forward returns " +
                    (schema.returns().size() == 1 ? schema.returns()[0].type()->str()
                                                  : std::to_string(schema.returns().size()) +
                                                        " values") +
                    "; hpc_train trains one tensor of logits [batch, num_classes]");
}

// FlatParameters and the reducer take every parameter as a trained, floating-point tensor of
// its own.
void check_parameters(const torch::jit::Module& module, const std::string& path) {
  std::map<const c10::TensorImpl*, std::string> owner;
  size_t count = 0;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    ++count;
    const std::string where = path + ": parameter " + item.name + " ";
    if (!item.value.is_floating_point())
      throw DataError(where + "is " + std::string(c10::toString(item.value.scalar_type())) +
                      "; hpc_train trains floating-point parameters (keep others as buffers)");
    if (!item.value.requires_grad())
      throw DataError(where + "does not require gradients; hpc_train trains every parameter: "
                      "register a tensor that stays fixed as a buffer (register_buffer)");
    const auto [previous, fresh] = owner.emplace(item.value.unsafeGetTensorImpl(), item.name);
    if (!fresh)
      throw DataError(where + "is the same tensor as " + previous->second +
                      "; tied (shared) parameters are not supported");
  }
  if (count == 0) throw DataError(path + ": the module has no parameters to train");
}

// Note [Probe forward]: one forward of a batch of zeros, in eval mode and without gradients:
// BatchNorm normalises with its running statistics and updates none, dropout draws nothing, so
// the module leaves it as it came, and the random generators are untouched.
void check_output_shape(torch::jit::Module& module, const std::string& path,
                        const ModelShape& shape) {
  const std::vector<int64_t> input = {kProbeBatch, shape.channels, shape.height, shape.width};
  torch::NoGradGuard no_grad;
  torch::jit::GraphOptimizerEnabledGuard interpreted(false);  // Note [Scripted module executor]
  module.eval();
  torch::Tensor logits;
  try {
    logits = module.forward({torch::zeros(input)}).toTensor();
  } catch (const std::exception& e) {
    throw DataError(path + ": forward fails on a batch of the dataset's images " +
                    shape_text(input) + " (float32): " + libtorch_message(e));
  }
  module.train();
  if (logits.dim() != 2 || logits.size(0) != kProbeBatch || logits.size(1) != shape.num_classes)
    throw DataError(path + ": forward maps a batch of the dataset's images " + shape_text(input) +
                    " to " + shape_text(logits.sizes()) + "; the dataset has " +
                    std::to_string(shape.num_classes) + " classes, so it must return logits " +
                    shape_text({kProbeBatch, shape.num_classes}) + " ([batch, num_classes])");
  if (!logits.is_floating_point())
    throw DataError(path + ": forward returns " +
                    std::string(c10::toString(logits.scalar_type())) +
                    " values; logits must be floating-point");
}

// Note [Unused parameters]: a parameter that the logits do not depend on gets no gradient. The
// reducer would still average its slot (zero) every step, without a word, and the optimizer move
// it (weight decay) while it learns nothing: a module trained as it was not meant to be.
// PyTorch's DistributedDataParallel refuses such a module by default too, at its second
// iteration ("Expected to have finished reduction in the prior iteration", the parameters by
// index), unless find_unused_parameters=True, which hpc_train does not offer. So the module is
// refused here, before any training, with the parameters' names: one forward in training mode
// (the mode the steps run in, so that a branch taken only in training counts), of the probe's
// batch of zeros, and one backward, which tells which parameters the graph reaches
// (torch::autograd::grad with allow_unused; no `.grad` is written). What that forward changes
// is put back: the buffers (BatchNorm's running statistics and its count) and the CPU random
// generator (dropout's draws), so that the run starts as it would without the check. A parameter
// left out only on some inputs (data-dependent control flow) is not seen here.
void check_every_parameter_is_used(torch::jit::Module& module, const std::string& path,
                                   const ModelShape& shape) {
  const std::vector<int64_t> input = {kProbeBatch, shape.channels, shape.height, shape.width};
  std::vector<std::string> names;
  std::vector<torch::Tensor> parameters;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    names.push_back(item.name);
    parameters.push_back(item.value);
  }
  std::vector<torch::Tensor> saved_buffers;
  for (const auto& item : module.named_buffers(/*recurse=*/true))
    saved_buffers.push_back(item.value.detach().clone());
  at::Generator generator = at::globalContext().defaultGenerator(torch::Device(torch::kCPU));
  const torch::Tensor generator_state = generator.get_state();
  std::vector<torch::Tensor> gradients;
  std::string failure;
  try {
    torch::jit::GraphOptimizerEnabledGuard interpreted(false);  // Note [Scripted module executor]
    module.train();
    const torch::Tensor logits = module.forward({torch::zeros(input)}).toTensor();
    if (logits.requires_grad())  // else no parameter reaches the logits
      gradients = torch::autograd::grad({logits.sum()}, parameters, /*grad_outputs=*/{},
                                        /*retain_graph=*/false, /*create_graph=*/false,
                                        /*allow_unused=*/true);
  } catch (const std::exception& e) {
    failure = libtorch_message(e);
  }
  {
    torch::NoGradGuard no_grad;
    size_t b = 0;
    for (const auto& item : module.named_buffers(/*recurse=*/true))
      if (b < saved_buffers.size()) item.value.set_data(saved_buffers[b++]);
  }
  generator.set_state(generator_state);
  if (!failure.empty())
    throw DataError(path + ": forward and backward fail in training mode on a batch of the "
                    "dataset's images " + shape_text(input) + " (float32): " + failure);
  std::string unused;
  size_t count = 0;
  for (size_t p = 0; p < parameters.size(); ++p)
    if (gradients.empty() || !gradients[p].defined()) unused += (count++ ? ", " : "") + names[p];
  if (count > 0)
    throw DataError(path + ": no gradient reaches " + (count == 1 ? "parameter " : "parameters ") +
                    unused + ": the logits of a forward in training mode do not depend on " +
                    (count == 1 ? "it" : "them") + " (forward and backward of a batch of zeros " +
                    shape_text(input) + "). hpc_train, like DistributedDataParallel without "
                    "find_unused_parameters, trains every parameter by its gradient in every "
                    "step: use each parameter in forward, delete those it does not use, or "
                    "register a tensor that stays fixed as a buffer (register_buffer)");
}

}  // namespace

std::unique_ptr<TrainableModel> load_scripted_model(const std::string& path,
                                                    const ModelShape& shape) {
  const TorchScriptFileInfo info = check_file(path);
  torch::jit::Module module;
  try {
    // Onto the CPU whatever device it was saved from; the trainer moves it.
    module = torch::jit::load(path, torch::Device(torch::kCPU));
  } catch (const std::exception& e) {
    throw DataError(path + ": LibTorch " + TORCH_VERSION + " cannot load this TorchScript file (" +
                    libtorch_message(e) +
                    "). A module from a newer PyTorch may use operators this LibTorch lacks: "
                    "save it with PyTorch " + TORCH_VERSION + ", or build hpc_train with a "
                    "newer LibTorch");
  }
  check_forward_signature(module, path);
  check_parameters(module, path);
  check_output_shape(module, path, shape);
  check_every_parameter_is_used(module, path, shape);  // Note [Unused parameters]
  module.train();
  return std::make_unique<ScriptedModel>(std::move(module),
                                         kTorchScriptIdentityPrefix + info.content_identity);
}

}  // namespace hpc_train

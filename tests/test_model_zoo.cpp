// The model zoo against PyTorch. Every name of the model registry, built here with make_model
// and in PyTorch by tests/support/model_zoo_reference.py (torchvision's networks, and
// bench/reference/models.py's definitions of the others), must have
//   - the same state_dict: keys, shapes, dtypes and order;
//   - the same logits for the same weights and input, in evaluation mode, fp32: each within
//     1e-5 of PyTorch's, relative to the logit where |logit| > 1 (kLogitTolerance);
//   - the FLOP count that forward hooks make in PyTorch, exactly, at several image shapes;
//   - torchvision's initialisation (Note [torchvision's initialisation]), or LibTorch's default
//     for simple_cnn and resnet18, as the standard deviations of the drawn weights show.
// The reference files come from the CTest fixture model_zoo_reference, in the directory that
// HPC_TRAIN_MODEL_ZOO_REFERENCE names.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "hpc_train/model/model_names.h"
#include "hpc_train/model/models.h"
#include "hpc_train/io/safetensors.h"

namespace {

using namespace hpc_train;
namespace nn = torch::nn;

constexpr double kLogitTolerance = 1e-5;

std::string reference_directory() {
  const char* directory = std::getenv("HPC_TRAIN_MODEL_ZOO_REFERENCE");
  return directory ? directory : "";
}

// PyTorch's state_dict order: a module's own parameters, then its own buffers, then its
// children's entries, depth first in the order the children were registered.
std::vector<std::pair<std::string, torch::Tensor>> state_dict(const nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> entries;
  for (const auto& module : model.named_modules()) {
    const std::string prefix = module.key().empty() ? "" : module.key() + ".";
    for (const auto& parameter : module.value()->named_parameters(/*recurse=*/false))
      entries.emplace_back(prefix + parameter.key(), parameter.value());
    for (const auto& buffer : module.value()->named_buffers(/*recurse=*/false))
      entries.emplace_back(prefix + buffer.key(), buffer.value());
  }
  return entries;
}

std::string safetensors_dtype(const torch::Tensor& tensor) {
  return tensor.scalar_type() == torch::kLong ? "I64" : tensor.scalar_type() == torch::kFloat ? "F32" : "?";
}

torch::Tensor read_tensor(const std::string& path, const SafetensorsHeader& header,
                          const std::string& name) {
  const SafetensorsTensorInfo* info = header.find(name);
  if (info == nullptr) throw std::runtime_error(path + " has no tensor " + name);
  std::vector<uint8_t> bytes = read_safetensors_tensor(path, header, name);
  const auto dtype = info->dtype == "I64" ? torch::kLong : torch::kFloat;
  return torch::from_blob(bytes.data(), info->shape, dtype).clone();
}

ModelShape shape_of(const SafetensorsHeader& header) {
  auto number = [&](const char* key) { return std::stoll(header.metadata.at(key)); };
  return {number("channels"), number("height"), number("width"), number("num_classes")};
}

// The standard deviation that initialisation draws a convolution's weight [out, in, kh, kw] from.
double expected_conv_std(const std::string& model, const torch::Tensor& weight) {
  const double receptive = static_cast<double>(weight.size(2) * weight.size(3));
  // LibTorch's default, kaiming_uniform_ with a = sqrt(5): uniform(+-1/sqrt(fan_in)).
  if (model == "simple_cnn" || model == "resnet18")
    return 1.0 / std::sqrt(3.0 * static_cast<double>(weight.size(1)) * receptive);
  // torchvision: kaiming_normal_, fan_out, ReLU gain sqrt(2).
  return std::sqrt(2.0 / (static_cast<double>(weight.size(0)) * receptive));
}

// Note [torchvision's initialisation], read back from the drawn weights: a sample standard
// deviation of n draws is within 5 / sqrt(2n) of the true one (5 sigma), so only tensors of
// 1000 elements or more are checked that way.
void check_initialisation(const std::string& name, const nn::Module& model) {
  const bool torchvision = name != "simple_cnn" && name != "resnet18";
  const bool vgg = name.rfind("vgg", 0) == 0;
  int checked = 0;
  for (const auto& module : model.named_modules()) {
    SCOPED_TRACE(name + ": " + module.key());
    if (const auto* conv = module.value()->as<nn::Conv2d>()) {
      const torch::Tensor& weight = conv->weight;
      if (weight.numel() >= 1000) {
        const double expected = expected_conv_std(name, weight);
        const double tolerance = 5.0 / std::sqrt(2.0 * static_cast<double>(weight.numel()));
        EXPECT_NEAR(weight.std().item<double>() / expected, 1.0, tolerance);
        ++checked;
      }
      if (torchvision && conv->bias.defined()) EXPECT_EQ(conv->bias.abs().max().item<float>(), 0.0f);
    } else if (const auto* norm = module.value()->as<nn::BatchNorm2d>()) {
      EXPECT_TRUE(torch::equal(norm->weight, torch::ones_like(norm->weight)));
      EXPECT_TRUE(torch::equal(norm->bias, torch::zeros_like(norm->bias)));
    } else if (const auto* fc = module.value()->as<nn::Linear>(); fc && vgg) {
      const double tolerance = 5.0 / std::sqrt(2.0 * static_cast<double>(fc->weight.numel()));
      EXPECT_NEAR(fc->weight.std().item<double>() / 0.01, 1.0, tolerance);
      EXPECT_EQ(fc->bias.abs().max().item<float>(), 0.0f);
    }
  }
  EXPECT_GT(checked, 0) << name << ": no convolution was checked";
}

class ModelZoo : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelZoo, MatchesPyTorch) {
  const std::string name = GetParam();
  ASSERT_FALSE(reference_directory().empty())
      << "HPC_TRAIN_MODEL_ZOO_REFERENCE is not set: run this test with ctest (the fixture "
         "model_zoo_reference writes the files)";
  const std::string weights_path = reference_directory() + "/" + name + ".safetensors";
  const std::string io_path = reference_directory() + "/" + name + ".io.safetensors";
  ASSERT_TRUE(std::ifstream(weights_path).good())
      << "no PyTorch reference for " << name << " (" << weights_path
      << "): add it to tests/support/model_zoo_reference.py and bench/reference/models.py";
  const SafetensorsHeader weights = read_safetensors_header(weights_path);
  const SafetensorsHeader io = read_safetensors_header(io_path);
  const ModelShape shape = shape_of(weights);

  torch::manual_seed(1);
  const std::shared_ptr<Model> model = make_model(name, shape);
  check_initialisation(name, *model);

  // Keys, shapes, dtypes and order: the file holds PyTorch's state_dict in its order.
  const auto mine = state_dict(*model);
  std::vector<std::string> my_keys, their_keys;
  for (const auto& entry : mine) my_keys.push_back(entry.first);
  for (const auto& tensor : weights.tensors) their_keys.push_back(tensor.name);
  ASSERT_EQ(my_keys, their_keys);
  for (const auto& [key, tensor] : mine) {
    const SafetensorsTensorInfo& info = *weights.find(key);
    EXPECT_EQ(tensor.sizes().vec(), info.shape) << key;
    EXPECT_EQ(safetensors_dtype(tensor), info.dtype) << key;
  }

  {
    torch::NoGradGuard no_grad;
    for (const auto& [key, tensor] : mine) tensor.copy_(read_tensor(weights_path, weights, key));
  }
  const torch::Tensor input = read_tensor(io_path, io, "input");
  const torch::Tensor expected = read_tensor(io_path, io, "logits");
  model->eval();
  torch::Tensor logits;
  {
    torch::NoGradGuard no_grad;
    logits = model->forward(input);
  }
  ASSERT_EQ(logits.sizes(), expected.sizes());
  const torch::Tensor difference = (logits - expected).abs();
  const torch::Tensor allowed = kLogitTolerance * torch::clamp_min(expected.abs(), 1.0);
  const double max_difference = difference.max().item<double>();
  std::printf("%s at %lldx%lldx%lld: max |logit - PyTorch's| %.3g (|logits| up to %.3g)\n",
              name.c_str(), static_cast<long long>(shape.channels),
              static_cast<long long>(shape.height), static_cast<long long>(shape.width),
              max_difference, expected.abs().max().item<double>());
  EXPECT_TRUE((difference <= allowed).all().item<bool>())
      << name << ": logits differ from PyTorch's by up to " << max_difference << "\nmine:\n"
      << logits << "\nPyTorch's:\n" << expected;

  if (name.rfind("vgg", 0) == 0) {
    // The classifier's dropout is on in training mode: the same input gives other logits.
    torch::NoGradGuard no_grad;
    model->train();
    EXPECT_FALSE(torch::allclose(model->forward(input), model->forward(input)))
        << name << ": dropout is off in training mode";
  }
}

INSTANTIATE_TEST_SUITE_P(Registry, ModelZoo, ::testing::ValuesIn(model_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(ModelZooFlops, MatchForwardHooksInPyTorch) {
  ASSERT_FALSE(reference_directory().empty()) << "HPC_TRAIN_MODEL_ZOO_REFERENCE is not set";
  std::ifstream file(reference_directory() + "/flops.json");
  ASSERT_TRUE(file.good()) << "no flops.json in " << reference_directory();
  const nlohmann::json cases = nlohmann::json::parse(file);
  std::set<std::string> counted;
  for (const auto& c : cases) {
    const std::string name = c.at("model");
    const ModelShape shape{c.at("channels"), c.at("height"), c.at("width"), c.at("num_classes")};
    const double expected = c.at("forward_flops").get<double>();
    EXPECT_EQ(forward_flops_per_sample(name, shape), expected)
        << name << " at " << shape.channels << "x" << shape.height << "x" << shape.width;
    std::printf("%s at %lldx%lldx%lld: %.0f forward FLOPs\n", name.c_str(),
                static_cast<long long>(shape.channels), static_cast<long long>(shape.height),
                static_cast<long long>(shape.width), expected);
    counted.insert(name);
  }
  EXPECT_EQ(counted, std::set<std::string>(model_names().begin(), model_names().end()))
      << "flops.json and the registry name different models";
}

// Note [Pool before bias]: simple_cnn pools before its convolutions' bias and ReLU; its gradients
// are those of PyTorch's order, pool last (fp32, each within 1e-5 of the largest of its tensor).
TEST(SimpleCnn, GradientsAreThoseOfPyTorchsOrder) {
  torch::manual_seed(4);
  const ModelShape shape{3, 12, 12, 10};
  const std::shared_ptr<Model> model = make_model("simple_cnn", shape);
  nn::Sequential reference(
      nn::Conv2d(nn::Conv2dOptions(3, 32, 3).padding(1)), nn::Functional(torch::relu),
      nn::MaxPool2d(2), nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)),
      nn::Functional(torch::relu), nn::MaxPool2d(2), nn::Flatten(), nn::Linear(64 * 3 * 3, 512),
      nn::Functional(torch::relu), nn::Linear(512, 10));
  const std::vector<torch::Tensor> mine = model->parameters();
  const std::vector<torch::Tensor> theirs = reference->parameters();
  ASSERT_EQ(mine.size(), theirs.size());
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < mine.size(); ++i) theirs[i].copy_(mine[i]);
  }
  const torch::Tensor images = torch::randn({8, 3, 12, 12});
  const torch::Tensor labels = torch::randint(10, {8});
  torch::nn::functional::cross_entropy(model->forward(images), labels).backward();
  torch::nn::functional::cross_entropy(reference->forward(images), labels).backward();
  for (size_t i = 0; i < mine.size(); ++i) {
    const double largest = theirs[i].grad().abs().max().item<double>();
    ASSERT_GT(largest, 0.0) << "parameter " << i << " got no gradient";
    EXPECT_LE((mine[i].grad() - theirs[i].grad()).abs().max().item<double>(), 1e-5 * largest)
        << "parameter " << i;
  }
}

}  // namespace

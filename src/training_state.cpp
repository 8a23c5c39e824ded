#include "hpc_train/training_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <utility>

namespace hpc_train {
namespace {

std::vector<float> to_host_floats(const torch::Tensor& t) {
  const torch::Tensor host = t.detach().to(torch::kCPU, torch::kFloat).contiguous();
  return std::vector<float>(host.data_ptr<float>(), host.data_ptr<float>() + host.numel());
}

}  // namespace

std::vector<CheckpointTensor> model_state(const torch::nn::Module& model) {
  std::vector<CheckpointTensor> state;
  auto add = [&](const std::string& name, const torch::Tensor& value) {
    const bool integral = !at::isFloatingType(value.scalar_type());
    const torch::Tensor host =
        value.detach().to(torch::kCPU, integral ? torch::kLong : torch::kFloat).contiguous();
    CheckpointTensor tensor;
    tensor.name = name;
    tensor.dtype = integral ? "I64" : "F32";
    tensor.shape = host.sizes().vec();
    const auto* bytes = static_cast<const uint8_t*>(host.data_ptr());
    tensor.data.assign(bytes, bytes + host.numel() * host.element_size());
    state.push_back(std::move(tensor));
  };
  for (const auto& item : model.named_parameters()) add(item.key(), item.value());
  for (const auto& item : model.named_buffers()) add(item.key(), item.value());
  return state;
}

Checkpoint model_checkpoint(const std::string& model_name, const DatasetInfo& input,
                            const torch::nn::Module& model, int64_t global_step) {
  Checkpoint c;
  c.model = model_name;
  c.channels = input.channels;
  c.height = input.height;
  c.width = input.width;
  c.num_classes = input.num_classes;
  c.position.global_step = global_step;
  c.model_state = model_state(model);
  return c;
}

void add_optimizer_and_rng_state(Checkpoint& c, const FullOptimizerState& state) {
  c.optimizer_steps = state.steps;
  c.master = to_host_floats(state.master);
  c.exp_avg = to_host_floats(state.exp_avg);
  c.exp_avg_sq = to_host_floats(state.exp_avg_sq);
  const torch::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
  c.rng_state.assign(rng.data_ptr<uint8_t>(), rng.data_ptr<uint8_t>() + rng.numel());
}

FullOptimizerState restore_model_and_rng(const Checkpoint& c, const std::string& path,
                                         const std::string& model_name, const DatasetInfo& input,
                                         torch::nn::Module& model, int64_t flat_numel,
                                         const torch::Device& device) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected;
  for (const auto& item : model.named_parameters())
    expected.emplace_back(item.key(), item.value().sizes().vec());
  std::map<std::string, torch::Tensor> buffers;
  for (const auto& item : model.named_buffers()) {
    expected.emplace_back(item.key(), item.value().sizes().vec());
    buffers[item.key()] = item.value();
  }
  check_checkpoint_fits(c, path, model_name, input.channels, input.height, input.width,
                        input.num_classes, expected, flat_numel);
  torch::NoGradGuard no_grad;
  for (const CheckpointTensor& tensor : c.model_state) {
    const auto buffer = buffers.find(tensor.name);
    if (buffer == buffers.end()) continue;
    buffer->second.copy_(torch::from_blob(const_cast<uint8_t*>(tensor.data.data()), tensor.shape,
                                          tensor.dtype == "I64" ? torch::kLong : torch::kFloat));
  }
  if (!c.rng_state.empty()) {
    torch::Tensor rng = torch::empty({static_cast<int64_t>(c.rng_state.size())}, torch::kUInt8);
    std::memcpy(rng.data_ptr<uint8_t>(), c.rng_state.data(), c.rng_state.size());
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(rng);
  }
  auto from_vector = [&](const std::vector<float>& values) {
    return torch::from_blob(const_cast<float*>(values.data()),
                            {static_cast<int64_t>(values.size())}, torch::kFloat)
        .to(device);
  };
  FullOptimizerState state;
  state.master = from_vector(c.master);
  state.exp_avg = from_vector(c.exp_avg);
  state.exp_avg_sq = from_vector(c.exp_avg_sq);
  state.steps = c.optimizer_steps;
  return state;
}

std::string describe_loss_scaling(const std::string& precision, bool scaled, bool dynamic,
                                  double scale) {
  char text[96];
  if (!scaled) std::snprintf(text, sizeof text, "%s, no scaling", precision.c_str());
  else if (dynamic) std::snprintf(text, sizeof text, "%s, dynamic, scale %g", precision.c_str(), scale);
  else std::snprintf(text, sizeof text, "%s, fixed scale %g", precision.c_str(), scale);
  return text;
}

}  // namespace hpc_train

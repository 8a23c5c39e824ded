#include "example_checkpoints.h"

#include <limits>
#include <string>
#include <utility>

namespace hpc_train::test_support {

namespace {

// What the checkpoint is of: `model` for channels x height x width images of 10 classes, ZeRO
// stage 2 on 3 ranks. The caller fills in the state.
Checkpoint checkpoint_of(const std::string& model, int64_t channels, int64_t height,
                         int64_t width, const std::string& precision) {
  Checkpoint c;
  c.model = model;
  c.channels = channels;
  c.height = height;
  c.width = width;
  c.num_classes = 10;
  c.precision = precision;
  c.zero_stage = 2;
  c.world_size = 3;
  return c;
}

float float_from_bits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

CheckpointTensor random_f32(std::mt19937_64& rng, const std::string& name,
                            std::vector<int64_t> shape) {
  int64_t count = 1;
  for (int64_t dimension : shape) count *= dimension;
  std::normal_distribution<float> normal(0.0f, 0.1f);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& value : values) value = normal(rng);
  return {name, "F32", std::move(shape), as_bytes(values)};
}

}  // namespace

std::vector<uint8_t> random_bytes(std::mt19937_64& rng, size_t count) {
  std::vector<uint8_t> bytes(count);
  for (uint8_t& byte : bytes) byte = static_cast<uint8_t>(rng());
  return bytes;
}

Checkpoint realistic_checkpoint(uint64_t seed, size_t optimizer_elements) {
  std::mt19937_64 rng(seed);
  Checkpoint c = checkpoint_of("resnet18", 3, 32, 32, "fp16");
  c.config_ini =
      "# hpc_train resolved configuration\n[data]\ndataset = data/fashion mnist.h5\n\n[train]\n"
      "lr = 0.001\nnote = caf\xc3\xa9 \xe2\x9c\x93\n\n";
  c.position = {12345, 49380, 3, 1234, 17, 1234 * 16 * 3, 16, 4};
  c.optimizer_steps = 12328;
  c.has_loss_scaler = true;
  c.loss_scaler_dynamic = true;
  c.loss_scaler = {32768.0, 1, 12345, 12001, 17};
  c.rng_state = random_bytes(rng, 5056);
  for (size_t i : {size_t{0}, size_t{1}, size_t{100}, size_t{2500}, size_t{5055}})
    c.rng_state[i] = 0;
  c.cuda_rng_state = random_bytes(rng, 16);  // LibTorch's CUDA generator: seed, Philox offset
  c.cuda_rng_state[15] = 0;
  c.model_state.push_back(random_f32(rng, "conv1.weight", {64, 3, 3, 3}));
  c.model_state.push_back(random_f32(rng, "bn1.weight", {64}));
  c.model_state.push_back(random_f32(rng, "bn1.bias", {64}));
  c.model_state.push_back(random_f32(rng, "bn1.running_mean", {64}));
  c.model_state.push_back(random_f32(rng, "bn1.running_var", {64}));
  c.model_state.push_back(
      {"bn1.num_batches_tracked", "I64", {}, as_bytes(std::vector<int64_t>{12345})});
  c.model_state.push_back(random_f32(rng, "fc.weight", {10, 512}));
  c.model_state.push_back(random_f32(rng, "fc.bias", {10}));
  c.model_state.push_back(random_f32(rng, "layer1.0.downsample.0.weight", {0, 64, 1, 1}));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto* values : {&c.master, &c.exp_avg, &c.exp_avg_sq}) {
    values->resize(optimizer_elements);
    for (float& value : *values) value = normal(rng);
  }
  if (optimizer_elements > 100) {
    c.master[0] = -0.0f;
    c.master[1] = std::numeric_limits<float>::infinity();
    c.master[2] = float_from_bits(0x7fc01234);  // a NaN with a payload
    c.master[3] = std::numeric_limits<float>::denorm_min();
    c.master[optimizer_elements - 1] = -std::numeric_limits<float>::max();
  }
  return c;
}

Checkpoint tiny_checkpoint(bool fp16) {
  Checkpoint c = checkpoint_of("simple_cnn", 1, 4, 4, fp16 ? "fp16" : "fp32");
  c.config_ini = fp16 ? "[training]\nepochs = 2\n" : "";
  c.position.global_step = 7;
  c.position.micro_step = 14;
  c.position.epoch = 1;
  c.position.micro_steps_in_epoch = 3;
  c.position.samples_in_epoch = 36;
  c.position.micro_batch = 4;
  c.position.grad_accum = 2;
  c.loss_scaler_dynamic = fp16;
  c.optimizer_steps = 7;
  c.has_loss_scaler = fp16;
  c.loss_scaler.scale = 1024.0;
  c.loss_scaler.hysteresis_left = 2;
  c.loss_scaler.steps = 7;
  c.loss_scaler.last_overflow_step = -1;
  c.rng_state = fp16 ? std::vector<uint8_t>{1, 2, 3, 4, 5} : std::vector<uint8_t>{};
  c.cuda_rng_state = fp16 ? std::vector<uint8_t>{7, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0}
                          : std::vector<uint8_t>{};
  c.model_state = {{"fc.weight", "F32", {2, 3}, as_bytes<float>({1, -2, 0.5f, 0, 3, -0.25f})},
                   {"fc.bias", "F32", {2}, as_bytes<float>({0.125f, -1})},
                   {"bn.num_batches_tracked", "I64", {}, as_bytes<int64_t>({5})}};
  c.master = {1, -2, 0.5f, 0, 3, -0.25f, 0.125f, -1};
  c.exp_avg.assign(c.master.size(), 0.01f);
  c.exp_avg_sq.assign(c.master.size(), 0.0001f);
  return c;
}

}  // namespace hpc_train::test_support

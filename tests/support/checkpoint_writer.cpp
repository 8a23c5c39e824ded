// checkpoint_writer: checkpoints whose every value follows from their step, for the script tests.
//
//   checkpoint_writer make PATH STEP CxHxW      writes one checkpoint of step STEP to PATH
//   checkpoint_writer write RUN_DIR CxHxW KEEP  from the step after the newest readable
//                                               checkpoint on, writes steps until killed,
//                                               pruning to KEEP files after each; prints
//                                               "pid P" (its own, to kill it by), then
//                                               "writing step N" and "wrote step N" (flushed)
//   checkpoint_writer verify RUN_DIR            checks every checkpoint in RUN_DIR against
//                                               its step (none may be unreadable); prints
//                                               "latest step N" for the one that
//                                               find_latest_checkpoint returns, or
//                                               "no checkpoint"
//
// The model is simple_cnn for CxHxW images and 10 classes (the names and shapes of
// tests/support/check_safetensors.py). Element i of model tensor t (state_dict order) at step s
// is ((7 i + 131 t + 1009 s) mod 65521) / 4, exact in float32; the optimizer arrays (one value
// per model element) use t = 1000, 1001, 1002. test_export_tool.sh recomputes the weights from
// this formula in Python. Exit codes: 0 ok, 1 a mismatch or failure, 2 usage.
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "hpc_train/io/checkpoint.h"
#include "hpc_train/io/checkpoint_files.h"
#include "hpc_train/error.h"
#include "hpc_train/runtime/runtime.h"

using namespace hpc_train;

namespace {

constexpr int64_t kClasses = 10;
constexpr size_t kRngStateBytes = 4099;

float value_at(int64_t step, int64_t tensor, int64_t element) {
  return static_cast<float>((7 * element + 131 * tensor + 1009 * step) % 65521) / 4.0f;
}

struct InputShape {
  int64_t channels = 0, height = 0, width = 0;
};

InputShape parse_shape(const std::string& text) {
  InputShape shape;
  long long c = 0, h = 0, w = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%lldx%lldx%lld%c", &c, &h, &w, &tail) != 3 || c < 1 || h < 4 ||
      w < 4)
    throw ConfigError("shape '" + text + "' is not CxHxW (H, W >= 4)");
  shape.channels = c;
  shape.height = h;
  shape.width = w;
  return shape;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> simple_cnn_tensors(const InputShape& in) {
  return {{"conv1.weight", {32, in.channels, 3, 3}},
          {"conv1.bias", {32}},
          {"conv2.weight", {64, 32, 3, 3}},
          {"conv2.bias", {64}},
          {"fc1.weight", {512, 64 * (in.height / 4) * (in.width / 4)}},
          {"fc1.bias", {512}},
          {"fc2.weight", {kClasses, 512}},
          {"fc2.bias", {kClasses}}};
}

std::vector<float> float_values(int64_t step, int64_t tensor, int64_t count) {
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[i] = value_at(step, tensor, i);
  return values;
}

Checkpoint expected_checkpoint(int64_t step, const InputShape& in) {
  Checkpoint c;
  c.model = "simple_cnn";
  c.channels = in.channels;
  c.height = in.height;
  c.width = in.width;
  c.num_classes = kClasses;
  c.precision = "fp16";
  c.zero_stage = 2;
  c.world_size = 1;
  c.config_ini = "[train]\nstep = " + std::to_string(step) + "\n";
  c.position = {step, 4 * step, step / 10, 4 * step % 40, step / 7, 4 * step % 40 * 8, 8, 1};
  c.optimizer_steps = step - step / 7;
  c.has_loss_scaler = true;
  c.loss_scaler = {65536.0 / static_cast<double>(1 + step % 3), 1, step, step / 2, step / 7};
  for (size_t i = 0; i < kRngStateBytes; ++i)
    c.rng_state.push_back(static_cast<uint8_t>((31 * i + static_cast<size_t>(step)) % 256));
  int64_t numel = 0, index = 0;
  for (const auto& [name, shape] : simple_cnn_tensors(in)) {
    int64_t count = 1;
    for (int64_t dimension : shape) count *= dimension;
    const std::vector<float> values = float_values(step, index++, count);
    CheckpointTensor tensor{name, "F32", shape, std::vector<uint8_t>(values.size() * 4)};
    std::memcpy(tensor.data.data(), values.data(), tensor.data.size());
    c.model_state.push_back(std::move(tensor));
    numel += count;
  }
  c.master = float_values(step, 1000, numel);
  c.exp_avg = float_values(step, 1001, numel);
  c.exp_avg_sq = float_values(step, 1002, numel);
  return c;
}

// The first field in which `actual` differs from `expected`, or "".
std::string first_difference(const Checkpoint& actual, const Checkpoint& expected) {
  const TrainingPosition& a = actual.position;
  const TrainingPosition& e = expected.position;
  const LossScalerState& as = actual.loss_scaler;
  const LossScalerState& es = expected.loss_scaler;
  const std::pair<const char*, bool> checks[] = {
      {"model", actual.model == expected.model},
      {"input shape", actual.channels == expected.channels && actual.height == expected.height &&
                          actual.width == expected.width &&
                          actual.num_classes == expected.num_classes},
      {"precision/zero_stage/world_size", actual.precision == expected.precision &&
                                              actual.zero_stage == expected.zero_stage &&
                                              actual.world_size == expected.world_size},
      {"config_ini", actual.config_ini == expected.config_ini},
      {"position", a.global_step == e.global_step && a.micro_step == e.micro_step &&
                       a.epoch == e.epoch && a.micro_steps_in_epoch == e.micro_steps_in_epoch &&
                       a.skipped_steps == e.skipped_steps &&
                       a.samples_in_epoch == e.samples_in_epoch &&
                       a.micro_batch == e.micro_batch && a.grad_accum == e.grad_accum},
      {"optimizer_steps", actual.optimizer_steps == expected.optimizer_steps},
      {"loss scaler", actual.has_loss_scaler == expected.has_loss_scaler &&
                          actual.loss_scaler_dynamic == expected.loss_scaler_dynamic &&
                          as.scale == es.scale &&
                          as.hysteresis_left == es.hysteresis_left && as.steps == es.steps &&
                          as.last_overflow_step == es.last_overflow_step &&
                          as.skipped_steps == es.skipped_steps},
      {"rng_state", actual.rng_state == expected.rng_state},
      {"master", actual.master == expected.master},
      {"exp_avg", actual.exp_avg == expected.exp_avg},
      {"exp_avg_sq", actual.exp_avg_sq == expected.exp_avg_sq},
  };
  for (const auto& [field, same] : checks)
    if (!same) return field;
  if (actual.model_state.size() != expected.model_state.size()) return "model tensor count";
  for (size_t i = 0; i < actual.model_state.size(); ++i) {
    const CheckpointTensor& x = actual.model_state[i];
    const CheckpointTensor& y = expected.model_state[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape || x.data != y.data)
      return "model tensor " + y.name;
  }
  return "";
}

// step-00000012.h5 -> 12
int64_t step_of_name(const std::string& path) {
  const size_t start = path.rfind("step-");
  return start == std::string::npos ? -1 : std::stoll(path.substr(start + 5));
}

// "" when `path` holds exactly what its step wrote, else what is wrong.
std::string check_against_step(const std::string& path) {
  const Checkpoint actual = read_checkpoint(path);
  const int64_t step = actual.position.global_step;
  if (step != step_of_name(path)) return "holds step " + std::to_string(step);
  const InputShape in{actual.channels, actual.height, actual.width};
  const std::string difference = first_difference(actual, expected_checkpoint(step, in));
  return difference.empty()
             ? ""
             : difference + " differs from what step " + std::to_string(step) + " wrote";
}

int verify(const std::string& run_dir) {
  // Every checkpoint, not only the newest: an interrupted write must not have touched any.
  int problems = 0;
  std::error_code error;
  for (const auto& entry :
       std::filesystem::directory_iterator(checkpoint_directory(run_dir), error)) {
    const std::string name = entry.path().filename();
    if (name.rfind("step-", 0) != 0 || name.size() < 3 || name.substr(name.size() - 3) != ".h5")
      continue;
    try {
      const std::string problem = check_against_step(entry.path());
      if (!problem.empty()) {
        std::fprintf(stderr, "%s: %s\n", entry.path().c_str(), problem.c_str());
        ++problems;
      }
    } catch (const Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      ++problems;
    }
  }
  const std::optional<std::string> latest = find_latest_checkpoint(run_dir);
  if (problems > 0) return 1;
  if (!latest) {
    std::printf("no checkpoint\n");
    return 0;
  }
  std::printf("latest step %lld\n", static_cast<long long>(step_of_name(*latest)));
  return 0;
}

[[noreturn]] void write_forever(const std::string& run_dir, const InputShape& in, int keep) {
  std::printf("pid %lld\n", static_cast<long long>(::getpid()));
  const std::optional<std::string> latest = find_latest_checkpoint(run_dir);
  for (int64_t step = latest ? step_of_name(*latest) + 1 : 1;; ++step) {
    const Checkpoint checkpoint = expected_checkpoint(step, in);
    std::printf("writing step %lld\n", static_cast<long long>(step));
    std::fflush(stdout);
    write_checkpoint(MPI_COMM_WORLD, checkpoint_path(run_dir, step), checkpoint);
    std::printf("wrote step %lld\n", static_cast<long long>(step));
    std::fflush(stdout);
    prune_checkpoints(run_dir, keep);
  }
}

int run(const std::vector<std::string>& args) {
  const std::string command = args.empty() ? "" : args[0];
  if (command == "make" && args.size() == 4) {
    const int64_t step = std::stoll(args[2]);
    write_checkpoint(MPI_COMM_WORLD, args[1], expected_checkpoint(step, parse_shape(args[3])));
    return 0;
  }
  if (command == "write" && args.size() == 4)
    write_forever(args[1], parse_shape(args[2]), std::stoi(args[3]));
  if (command == "verify" && args.size() == 2) return verify(args[1]);
  std::fprintf(stderr,
               "usage: checkpoint_writer make PATH STEP CxHxW | write RUN_DIR CxHxW KEEP | "
               "verify RUN_DIR\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  // verify only reads, which needs no MPI: it starts faster without.
  std::optional<Runtime> runtime;
  if (argc < 2 || std::strcmp(argv[1], "verify") != 0) runtime.emplace(&argc, &argv);
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_writer: error: %s\n", e.what());
    return 1;
  }
}

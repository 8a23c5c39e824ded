#include "hpc_train/train/training_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <utility>

#include "hpc_train/io/checkpoint_files.h"
#include "hpc_train/error.h"
#include "hpc_train/monitor/metrics.h"
#include "hpc_train/train/run_options.h"

namespace hpc_train {
namespace {

// Copies `t` (on any device) into `out` as `dtype`, in the logical (contiguous) order, resizing
// `out` to fit. Note [Reused host copy]: `out`'s memory is written in place, one copy from the
// device, so a vector that held the last checkpoint's tensor takes no new pages.
template <typename Element>
void copy_to_host(const torch::Tensor& t, torch::Dtype dtype, std::vector<Element>& out) {
  const int64_t bytes = t.numel() * static_cast<int64_t>(c10::elementSize(dtype));
  out.resize(static_cast<size_t>(bytes) / sizeof(Element));
  if (bytes == 0) return;
  torch::from_blob(out.data(), t.sizes(), torch::TensorOptions().dtype(dtype)).copy_(t.detach());
}

// The state of `generator` (LibTorch's opaque bytes) into `out`, reusing its memory.
void take_generator_state(at::Generator generator, std::vector<uint8_t>& out) {
  torch::Tensor state;
  {
    // Note [Acquire lock when using random generators] (LibTorch's).
    std::lock_guard<std::mutex> lock(generator.mutex());
    state = generator.get_state();
  }
  const uint8_t* bytes = state.data_ptr<uint8_t>();
  out.assign(bytes, bytes + state.numel());
}

// Sets `generator` to `state`, read from `path`'s dataset `where`. LibTorch checks the state
// (its size, for the CUDA generator also the Philox offset's alignment): a state it refuses is
// the file's fault, named as such before training starts.
void restore_generator_state(at::Generator generator, const std::vector<uint8_t>& state,
                             const std::string& path, const char* where) {
  torch::Tensor bytes = torch::empty({static_cast<int64_t>(state.size())}, torch::kUInt8);
  std::memcpy(bytes.data_ptr<uint8_t>(), state.data(), state.size());
  try {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(bytes);
  } catch (const c10::Error& e) {
    throw DataError(path + ": " + where + " (" + std::to_string(state.size()) +
                    " bytes) is not a state of LibTorch's " + generator.device().str() +
                    " generator: " + e.what_without_backtrace());
  }
}

}  // namespace

void fill_model_state(const TrainableModel& model, std::vector<CheckpointTensor>& state) {
  size_t count = 0;
  auto add = [&](const std::string& name, const torch::Tensor& value) {
    const bool integral = !at::isFloatingType(value.scalar_type());
    if (state.size() <= count) state.emplace_back();
    CheckpointTensor& tensor = state[count++];
    tensor.name = name;
    tensor.dtype = integral ? "I64" : "F32";
    tensor.shape = value.sizes().vec();
    copy_to_host(value, integral ? torch::kLong : torch::kFloat, tensor.data);
  };
  for (const auto& item : model.named_parameters()) add(item.name, item.tensor);
  for (const auto& item : model.named_buffers()) add(item.name, item.tensor);
  state.resize(count);
}

void fill_model_checkpoint(const DatasetInfo& input, const TrainableModel& model,
                           int64_t global_step, Checkpoint& c) {
  c.model = model.identity();
  c.channels = input.channels;
  c.height = input.height;
  c.width = input.width;
  c.num_classes = input.num_classes;
  c.position.global_step = global_step;
  fill_model_state(model, c.model_state);
}

Checkpoint model_checkpoint(const DatasetInfo& input, const TrainableModel& model,
                            int64_t global_step) {
  Checkpoint c;
  fill_model_checkpoint(input, model, global_step, c);
  return c;
}

void add_optimizer_and_rng_state(Checkpoint& c, const FullOptimizerState& state,
                                 const torch::Device& device) {
  c.optimizer_steps = state.steps;
  copy_to_host(state.master, torch::kFloat, c.master);
  copy_to_host(state.exp_avg, torch::kFloat, c.exp_avg);
  copy_to_host(state.exp_avg_sq, torch::kFloat, c.exp_avg_sq);
  if (state.ema.defined()) copy_to_host(state.ema, torch::kFloat, c.ema);
  else c.ema.clear();
  // Note [Random state in checkpoints].
  take_generator_state(at::detail::getDefaultCPUGenerator(), c.rng_state);
  if (device.is_cuda())
    take_generator_state(at::globalContext().defaultGenerator(device), c.cuda_rng_state);
  else
    c.cuda_rng_state.clear();
}

namespace {

// Throws DataError naming `path` when `c` holds another model or input than `model` for `input`
// (check_checkpoint_fits), else copies the checkpoint's buffers, and its parameters too when
// `with_parameters`, into `model`.
void check_fits_and_copy(const Checkpoint& c, const std::string& path, const DatasetInfo& input,
                         TrainableModel& model, int64_t flat_numel, bool with_parameters) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected;
  std::map<std::string, torch::Tensor> targets;
  for (const auto& item : model.named_parameters()) {
    expected.emplace_back(item.name, item.tensor.sizes().vec());
    if (with_parameters) targets[item.name] = item.tensor;
  }
  for (const auto& item : model.named_buffers()) {
    expected.emplace_back(item.name, item.tensor.sizes().vec());
    targets[item.name] = item.tensor;
  }
  check_checkpoint_fits(c, path, model.identity(), input.channels, input.height, input.width,
                        input.num_classes, expected, flat_numel);
  torch::NoGradGuard no_grad;
  for (const CheckpointTensor& tensor : c.model_state) {
    const auto target = targets.find(tensor.name);
    if (target == targets.end()) continue;
    target->second.copy_(torch::from_blob(const_cast<uint8_t*>(tensor.data.data()), tensor.shape,
                                          tensor.dtype == "I64" ? torch::kLong : torch::kFloat));
  }
}

}  // namespace

void restore_model_state(const Checkpoint& c, const std::string& path, const DatasetInfo& input,
                         TrainableModel& model) {
  int64_t parameters = 0;  // the optimizer state's logical length: no padding
  for (const auto& item : model.named_parameters()) parameters += item.tensor.numel();
  check_fits_and_copy(c, path, input, model, parameters, /*with_parameters=*/true);
}

FullOptimizerState restore_model_and_rng(const Checkpoint& c, const std::string& path,
                                         const DatasetInfo& input, TrainableModel& model,
                                         int64_t flat_numel, const torch::Device& device) {
  // The parameters follow the master weights (ZeroOptimizer::load_full_state).
  check_fits_and_copy(c, path, input, model, flat_numel, /*with_parameters=*/false);
  // Note [Random state in checkpoints]: an empty state (none saved) leaves the generator as the
  // run's seed set it.
  if (!c.rng_state.empty())
    restore_generator_state(at::detail::getDefaultCPUGenerator(), c.rng_state, path,
                            "/training/rng_state");
  if (device.is_cuda() && !c.cuda_rng_state.empty())
    restore_generator_state(at::globalContext().defaultGenerator(device), c.cuda_rng_state, path,
                            "/training/cuda_rng_state");
  auto from_vector = [&](const std::vector<float>& values) {
    return torch::from_blob(const_cast<float*>(values.data()),
                            {static_cast<int64_t>(values.size())}, torch::kFloat)
        .to(device);
  };
  FullOptimizerState state;
  state.master = from_vector(c.master);
  state.exp_avg = from_vector(c.exp_avg);
  state.exp_avg_sq = from_vector(c.exp_avg_sq);
  if (!c.ema.empty()) state.ema = from_vector(c.ema);
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

void broadcast_buffers(TrainableModel& model, Communicator& comm) {
  for (const auto& item : model.named_buffers()) {
    const at::Tensor& buffer = item.tensor;
    at::Tensor contiguous = buffer.contiguous();
    comm.broadcast(contiguous, 0).wait();
    if (!contiguous.is_same(buffer)) buffer.copy_(contiguous);
  }
}

RunCheckpoints::RunCheckpoints(const TrainConfig& config, const DatasetInfo& input,
                               Communicator& comm, TrainableModel& model, int64_t flat_numel,
                               const torch::Device& device, ZeroOptimizer& optimizer,
                               RunReporter& reporter)
    : config_(config), input_(input), comm_(comm), model_(model), flat_numel_(flat_numel),
      device_(device), optimizer_(optimizer), reporter_(reporter),
      loss_scaling_(loss_scaling(config)) {}

std::string RunCheckpoints::to_resume() {
  if (!resumes_newest_checkpoint(config_)) return config_.resume;
  std::string found;
  if (comm_.rank() == 0) {
    std::vector<std::string> warnings;
    found = find_latest_checkpoint(config_.run_dir, &warnings).value_or("");
    for (const std::string& warning : warnings)
      std::fprintf(stderr, "warning: %s\n", warning.c_str());
    if (found.empty())
      reporter_.say("--resume auto: no checkpoint in %s yet, starting fresh\n",
                    checkpoint_directory(config_.run_dir).c_str());
  }
  return comm_.broadcast_string(found, 0, "checkpoint to resume");
}

Checkpoint& RunCheckpoints::fill_host_copy(const TrainingPosition& position) {
  Checkpoint& c = host_copy_;
  fill_model_checkpoint(input_, model_, position.global_step, c);
  add_optimizer_and_rng_state(c, optimizer_.gather_full_state(), device_);
  c.precision = to_string(config_.precision);
  c.zero_stage = config_.zero_stage;
  c.world_size = comm_.size();
  c.config_ini = to_ini(config_);
  c.position = position;
  c.has_loss_scaler = loss_scaling_.has_value();
  c.loss_scaler_dynamic = loss_scaling_ && loss_scaling_->fixed_scale <= 0;
  c.loss_scaler = optimizer_.report().scaler;
  return c;
}

std::string RunCheckpoints::save(const TrainingPosition& position, const char* why, Write write) {
  if (config_.run_dir.empty()) return "";
  Stopwatch wall;
  wait_for_writes();
  broadcast_buffers(model_, comm_);
  const std::string path = checkpoint_path(config_.run_dir, position.global_step);
  if (write == Write::kNow) {
    write_checkpoint(comm_.mpi_comm(), path, fill_host_copy(position));  // collective
    if (comm_.rank() == 0) {
      point_latest_checkpoint(config_.run_dir, path);  // Note [Checkpoint branches]
      prune_checkpoints(config_.run_dir, config_.keep_checkpoints);
    }
  } else if (comm_.rank() == 0) {
    // Note [Background checkpoint writes]: the thread reads the host copy until
    // wait_for_writes has seen it end.
    background_write_ = std::async(
        std::launch::async, [path, &checkpoint = fill_host_copy(position),
                             run_dir = config_.run_dir,
                             keep = config_.keep_checkpoints]() -> std::string {
          try {
            write_checkpoint_file(path, checkpoint);
            point_latest_checkpoint(run_dir, path);  // Note [Checkpoint branches]
            prune_checkpoints(run_dir, keep);
            return "";
          } catch (const std::exception& e) {
            return e.what();
          }
        });
  } else {
    // Rank 0 alone writes a background checkpoint: the others take part in the collective
    // gather of the optimizer's partitions and build no host copy of the state.
    optimizer_.gather_full_state();
  }
  reporter_.checkpoint(position, why, path, wall.elapsed_ms() / 1e3, write == Write::kBackground);
  return path;
}

void RunCheckpoints::start_branch(const std::string& resumed_from, int64_t step) {
  if (config_.run_dir.empty() || comm_.rank() != 0) return;
  // Note [Checkpoint branches].
  const std::string aside = set_aside_checkpoints_after(config_.run_dir, step);
  if (!aside.empty())
    reporter_.say("Checkpoints after step %lld, of the run this one abandons, moved to %s\n",
                  static_cast<long long>(step), aside.c_str());
  if (!resumed_from.empty()) point_latest_checkpoint(config_.run_dir, resumed_from);
}

void RunCheckpoints::wait_for_writes() {
  if (config_.run_dir.empty()) return;  // nothing was written (every rank has the same config)
  std::string failure;
  if (background_write_.valid()) failure = background_write_.get();
  failure = comm_.broadcast_string(failure, 0, "background checkpoint write");
  if (!failure.empty()) throw Error(failure);
}

namespace {

// The `optimizer = NAME` line of a checkpoint's resolved configuration (to_ini); "" where there
// is none.
std::string saved_optimizer(const std::string& config_ini) {
  std::istringstream lines(config_ini);
  std::string line;
  const std::string key = "optimizer = ";
  while (std::getline(lines, line))
    if (line.rfind(key, 0) == 0) return line.substr(key.size());
  return "";
}

// What `kind`'s optimizer state is, for the message below.
std::string optimizer_state(OptimizerKind kind) {
  if (keeps_adam_moments(kind)) return "Adam's moments";
  return kind == OptimizerKind::kLars ? "a momentum buffer of trust-scaled gradients"
                                      : "a momentum buffer";
}
}  // namespace

TrainingPosition RunCheckpoints::resume(const std::string& path) {
  const Checkpoint c = read_checkpoint(path);
  // The optimizer arrays mean what the saving run's rule made them (shares_optimizer_state).
  const std::string saved = saved_optimizer(c.config_ini);
  const std::optional<OptimizerKind> saved_kind = parse_choice<OptimizerKind>(saved);
  if (saved_kind && !shares_optimizer_state(*saved_kind, config_.optimizer))
    throw DataError(path + ": the checkpoint's optimizer state is " + saved + "'s; this run's "
                    "--optimizer is " + to_string(config_.optimizer) + ". " + saved + " keeps " +
                    optimizer_state(*saved_kind) + ", " + to_string(config_.optimizer) + " " +
                    optimizer_state(config_.optimizer) + ": resume with --optimizer " +
                    choice_names<OptimizerKind>([&](OptimizerKind kind) {
                      return shares_optimizer_state(*saved_kind, kind);
                    }) + ", or start a new run from the weights "
                    "(--export-weights, then --init-weights)");
  // check_checkpoint_fits compares identities; this says which file and what to do.
  if (names_torchscript_file(config_.model) && c.model != model_.identity())
    throw DataError(path + ": the checkpoint holds " + c.model + "; this run's --model " +
                    config_.model + " is " + model_.identity() +
                    ". hpc_train knows a TorchScript file by its content (a copy resumes, a file "
                    "saved again does not): resume with the file the run started from, which "
                    "the run directory's config.ini names");
  optimizer_.load_full_state(
      restore_model_and_rng(c, path, input_, model_, flat_numel_, device_));
  // Note [Scaler on resume] (checkpoint.h).
  const bool continue_scaler = continues_loss_scaler(c, loss_scaling_);
  const LossScalerState scaler_state =
      continue_scaler ? c.loss_scaler
                      : (loss_scaling_ ? LossScaler(*loss_scaling_).state() : LossScalerState{});
  optimizer_.resume(c.position.global_step, c.optimizer_steps, scaler_state);
  if (!continue_scaler && (c.has_loss_scaler || loss_scaling_))
    reporter_.say("Loss scaling: the checkpoint's (%s) does not carry over to this run's (%s); "
                  "starting at scale %g\n",
                  describe_loss_scaling(c.precision, c.has_loss_scaler, c.loss_scaler_dynamic,
                                        c.loss_scaler.scale)
                      .c_str(),
                  describe_loss_scaling(to_string(config_.precision), loss_scaling_.has_value(),
                                        loss_scaling_ && loss_scaling_->fixed_scale <= 0,
                                        scaler_state.scale)
                      .c_str(),
                  scaler_state.scale);
  TrainingPosition start = c.position;
  // A version 1 checkpoint did not record the position in samples; it continued at its
  // micro-steps times this run's micro-batch and world size, which is right when they are the
  // saving run's (or keep its global batch).
  if (start.samples_in_epoch < 0)
    start.samples_in_epoch = start.micro_steps_in_epoch * config_.micro_batch * comm_.size();
  ResumeReport resumed;  // Note [Resume record] (run_report.h)
  resumed.checkpoint = path;
  resumed.at.epoch = static_cast<int>(c.position.epoch);
  resumed.at.global_step = c.position.global_step;
  resumed.at.global_batch = int64_t{config_.micro_batch} * config_.grad_accum * comm_.size();
  resumed.samples_in_epoch = start.samples_in_epoch;
  resumed.world_size = comm_.size();
  resumed.checkpoint_world_size = c.world_size;
  reporter_.resumed(resumed);
  return start;
}

}  // namespace hpc_train

#include "hpc_train/train/run_options.h"

#include <algorithm>

#include "hpc_train/data/device_input.h"
#include "hpc_train/data/epoch_plan.h"
#include "hpc_train/error.h"
#include "hpc_train/optim/optimizer.h"
#include "hpc_train/runtime/runtime.h"
#include "hpc_train/train/step_graph.h"

namespace hpc_train {
namespace {

constexpr double kBytesPerMiB = 1024.0 * 1024.0;

}  // namespace

torch::Dtype model_dtype(const TrainConfig& config) {
  switch (config.precision) {
    case Precision::kFp16:
      return torch::kHalf;
    case Precision::kBf16:
      return torch::kBFloat16;
    case Precision::kFp32:
      break;
  }
  return torch::kFloat;
}

double bucket_mib(const TrainConfig& config, int world_size, int64_t gradient_bytes) {
  if (config.bucket_mb > 0.0) return config.bucket_mb;
  if (config.zero_stage != 2 || world_size == 1) return kDefaultBucketMiB;
  return std::min(kMaxPartitionedBucketMiB,
                  static_cast<double>(gradient_bytes) / kPartitionedBucketsPerGradient / kBytesPerMiB);
}

ReducerOptions reducer_options(const TrainConfig& config, int world_size, int64_t parameters) {
  ReducerOptions options;
  const int64_t element_bytes = config.comm_dtype == GradientDtype::kFp32
                                    ? 4
                                    : static_cast<int64_t>(c10::elementSize(model_dtype(config)));
  options.first_bucket_bytes = static_cast<int64_t>(config.first_bucket_mb * kBytesPerMiB);
  options.bucket_bytes = static_cast<int64_t>(
      bucket_mib(config, world_size, parameters * element_bytes) * kBytesPerMiB);
  options.overlap = config.overlap_comm;
  options.reduction = reduction_for_zero_stage(config.zero_stage);
  // Note [Gradient precision]: one micro-step has nothing to add up, and its 16-bit gradients
  // would go through the fp32 buffer unchanged; no buffer then.
  options.precision.accumulate_fp32 =
      config.grad_accum_dtype == GradientDtype::kFp32 && config.grad_accum > 1;
  options.precision.reduce_fp32 = config.comm_dtype == GradientDtype::kFp32;
  return options;
}

std::optional<LossScalerOptions> loss_scaling(const TrainConfig& config) {
  if (config.precision != Precision::kFp16) return std::nullopt;
  LossScalerOptions scaling;
  scaling.fixed_scale = config.loss_scale;
  scaling.initial_scale_power = config.initial_scale_power;
  scaling.scale_window = config.loss_scale_window;
  scaling.hysteresis = config.hysteresis;
  scaling.min_scale = config.min_loss_scale;
  return scaling;
}

ZeroOptions zero_options(const TrainConfig& config) {
  ZeroOptions zero;
  zero.stage = config.zero_stage;
  zero.optimizer = optimizer_options(config);
  zero.no_decay_below_2d = config.no_decay_bias_bn;
  zero.ema_decay = config.ema_decay;
  zero.momentum_from_schedule =
      config.lr_schedule == LrScheduleKind::kOneCycle && config.cycle_momentum;
  zero.clip_grad = config.clip_grad;
  zero.loss_scaling = loss_scaling(config);
  zero.check_overflow = zero.loss_scaling.has_value();
  return zero;
}

OptimizerOptions optimizer_options(const TrainConfig& config) {
  OptimizerOptions options;
  options.kind = config.optimizer;
  options.lr = config.lr;
  options.beta1 = config.beta1;
  options.beta2 = config.beta2;
  options.eps = config.eps;
  options.weight_decay = config.weight_decay;
  options.momentum = config.momentum;
  options.dampening = config.dampening;
  options.nesterov = config.nesterov;
  options.trust_coefficient = config.trust_coefficient;
  options.min_trust_ratio = config.min_trust_ratio;
  options.max_trust_ratio = config.max_trust_ratio;
  options.lamb_bias_correction = config.lamb_bias_correction;
  return options;
}

LrScheduleParams lr_schedule_options(const TrainConfig& config, int64_t run_steps,
                                     int64_t micro_steps_per_epoch) {
  LrScheduleParams options;
  options.kind = config.lr_schedule;
  options.lr = config.lr;
  options.warmup_steps = config.warmup_steps;
  options.warmup_type = config.warmup_type;
  options.warmup_start_ratio = config.warmup_start_ratio;
  options.cosine_final_ratio = config.cosine_final_ratio;
  options.total_steps = config.schedule_steps > 0 ? config.schedule_steps : run_steps;
  // one-cycle: 0 steps up is half the run, 0 steps down as many as up (DeepSpeed's default).
  options.cycle_min_ratio = config.cycle_min_ratio;
  options.cycle_first_steps =
      config.cycle_first_steps > 0 ? config.cycle_first_steps : std::max<int64_t>(1, run_steps / 2);
  options.cycle_second_steps =
      config.cycle_second_steps > 0 ? config.cycle_second_steps : options.cycle_first_steps;
  options.decay_step_size = config.cycle_decay_steps;
  options.decay_lr_rate = config.cycle_decay_lr_rate;
  options.decay_momentum_rate = config.cycle_decay_momentum_rate;
  options.cycle_momentum = config.cycle_momentum;
  options.cycle_min_momentum = config.cycle_min_momentum;
  options.cycle_max_momentum = config.cycle_max_momentum;
  std::vector<int64_t> milestones = lr_milestone_steps(config.lr_milestones);
  for (const int64_t epoch : lr_milestone_epochs(config.lr_milestone_epochs))
    milestones.push_back(std::max<int64_t>(1, epoch * micro_steps_per_epoch / config.grad_accum));
  options.milestone_count = static_cast<int32_t>(milestones.size());
  std::copy(milestones.begin(), milestones.end(), options.milestones);
  options.milestone_gamma = config.lr_gamma;
  return options;
}

bool cudnn_autotunes(const TrainConfig& config, int64_t batch_size) {
  return config.cudnn_benchmark && batch_size == config.micro_batch;
}

bool capture_steps(const TrainConfig& config, const Placement& placement) {
  const bool possible = placement.cuda && cuda_graphs_available() &&
                        placement.backend != CommBackendKind::kMpi && config.grad_accum == 1;
  if (config.cuda_graph == Switch::kOn && !possible)
    throw ConfigError("--cuda-graph on needs a GPU build, --device cuda, the nccl (or none) "
                      "backend and --grad-accum 1; use --cuda-graph auto or off");
  return possible && config.cuda_graph != Switch::kOff;
}

namespace {

// Auto's bound on what stays resident on `gpu` (Note [Resident splits and GPU memory]).
int64_t auto_resident_bytes(const GpuMemory& gpu) {
  return std::min({kAutoResidentBytes, gpu.total_bytes / kAutoResidentShareOfGpu,
                   gpu.free_bytes / kAutoResidentShareOfFree});
}

}  // namespace

// Note [Resident splits and GPU memory]
bool keep_train_split_resident(const TrainConfig& config, const DatasetInfo& info,
                               const std::optional<GpuMemory>& gpu) {
  const int64_t train_bytes = resident_split_bytes(info, Split::kTrain);
  if (config.resident_data == Switch::kOn && gpu && train_bytes > gpu->free_bytes)
    throw ConfigError("--resident-data on: the train split (" + std::to_string(info.train_size) +
                      " samples of " + info.sample_shape() + ", with labels) needs " +
                      memory_text(static_cast<double>(train_bytes)) +
                      " of GPU memory to stay resident, more than the " +
                      memory_text(static_cast<double>(gpu->free_bytes)) + " free on this GPU (of " +
                      memory_text(static_cast<double>(gpu->total_bytes)) +
                      "); use --resident-data auto or off");
  if (config.resident_data != Switch::kAuto) return config.resident_data == Switch::kOn;
  return gpu && config.data_store != DataStore::kMemory && train_bytes <= auto_resident_bytes(*gpu);
}

bool keep_test_split_resident(const TrainConfig& config, const DatasetInfo& info,
                              const std::optional<GpuMemory>& gpu) {
  if (!keep_train_split_resident(config, info, gpu)) return false;
  if (!gpu) return true;  // on, on the CPU: the host's memory was checked (validate_for_dataset)
  const int64_t both_bytes =
      resident_split_bytes(info, Split::kTrain) + resident_split_bytes(info, Split::kTest);
  return both_bytes <= (config.resident_data == Switch::kOn ? gpu->free_bytes
                                                            : auto_resident_bytes(*gpu));
}

// Note [Evaluation batch]
int64_t evaluation_batch(const TrainConfig& config, const DatasetInfo& info, int world_size,
                         bool cuda, Split split) {
  int64_t batch = config.eval_batch;
  if (batch == 0 && !cuda) {
    batch = kMinAutoEvalBatch;
  } else if (batch == 0) {
    const int64_t float_input_bytes = info.channels * info.height * info.width * 4;
    batch = std::clamp(kAutoEvalInputBytes / std::max<int64_t>(1, float_input_bytes),
                       kMinAutoEvalBatch, kMaxAutoEvalBatch);
  }
  return std::min(batch, largest_evaluation_share(info.size(split), world_size));
}

}  // namespace hpc_train

// The configuration mapped onto each part's options: one place that knows which --option feeds
// which part of the step (the parts themselves know nothing of TrainConfig).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <optional>

#include "hpc_train/config/config.h"
#include "hpc_train/optim/loss_scaler.h"
#include "hpc_train/optim/lr_schedule.h"
#include "hpc_train/comm/reducer.h"
#include "hpc_train/optim/zero_optimizer.h"

namespace hpc_train {

// The parameters' dtype (--precision): fp16 and bf16 keep the model in half precision, with
// fp32 master weights in the optimizer.
torch::Dtype model_dtype(const TrainConfig& config);

// --bucket-mb, --first-bucket-mb, --overlap-comm; ZeRO-2 reduce-scatters.
ReducerOptions reducer_options(const TrainConfig& config);

// fp16's loss scaling (--loss-scale 0: dynamic, from 2^--initial-scale-power); none otherwise.
std::optional<LossScalerOptions> loss_scaling(const TrainConfig& config);

// The partitioned optimizer: stage, Adam/AdamW, clipping, and fp16's overflow check and scaling.
ZeroOptions zero_options(const TrainConfig& config);

// The LR schedule of a run of `run_steps` optimizer steps (--schedule-steps, when given, sets
// the cosine's length instead).
LrScheduleParams lr_schedule_options(const TrainConfig& config, int64_t run_steps);

}  // namespace hpc_train

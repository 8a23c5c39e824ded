// The training step, written once: what one micro-step queues on the device, for the eager steps
// and for the step a CUDA graph captures alike (Note [One step]).
//
// One micro-step (DESIGN.md, "the corridor"): forward -> cross entropy -> backward from the
// optimizer's loss gradient, its gradients collected and reduced bucket by bucket by the reducer's
// hooks while backward goes on -> at an update's last micro-step, the optimizer. Every rank starts
// from rank 0's parameters, so all ranks stay identical.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/types.h>

#include <cstdint>

#include "hpc_train/config/config.h"
#include "hpc_train/data/device_input.h"
#include "hpc_train/model/models.h"
#include "hpc_train/monitor/run_report.h"

namespace hpc_train {

class Reducer;
class ZeroOptimizer;

// Note [One step]
// The eager steps and the captured one (GraphedStep) are the same code: TrainingStep::enqueue.
// What differs lies around it. An eager step is timed by phase (host clocks, which mean nothing
// inside a capture, where nothing runs) and may be followed by the bucket rebuild (the trainer's,
// after the first step taken, outside any capture: a graph is captured only once the layout is
// final); a captured step is queued once with no clocks, and replayed.

// Where a micro-step stands in its update (Note [Run length] in run_length.h).
struct MicroStep {
  bool ends_update = true;     // the update's last micro-step: reduce, then the optimizer steps
  int window_micro_steps = 1;  // the update's micro-steps: G of Note [Gradient averaging]
};

class TrainingStep {
 public:
  // `model`, `reducer` and `optimizer` must outlive the step. `channels_last`: the model's input
  // layout (Note [Channels-last weights] in flat_parameters.h); `cuda`: the model is on a GPU.
  TrainingStep(TrainableModel& model, Reducer& reducer, ZeroOptimizer& optimizer, int world_size,
               const TrainConfig& config, bool channels_last, bool cuda,
               const torch::Device& device);

  // Queues one micro-step on `batch` (input in the DeviceInput's layout): forward, loss, backward
  // and the reducer's collectives, and with micro.ends_update the optimizer's step. `phases`:
  // where the host's phase times and the reducer's figures go; nullptr inside a CUDA graph
  // capture. The micro-batch's mean loss is added to the loss sum, on the device (a replayed
  // capture adds its own).
  void enqueue(const DeviceBatch& batch, MicroStep micro, IntervalTimes* phases);
  // What the reducer left of a step whose capture failed part-way (Note [Failed capture] in
  // step_graph.h): the next enqueue begins as if it had never run.
  void discard();

  // The micro-batch losses summed since the last call (the caller counts the micro-steps: a
  // replayed graph adds without the host knowing); starts a new sum. Waits for the device.
  double take_loss_sum();

 private:
  TrainableModel& model_;
  Reducer& reducer_;
  ZeroOptimizer& optimizer_;
  int world_size_;
  const TrainConfig& config_;
  bool channels_last_;
  bool cuda_;
  torch::Tensor loss_sum_;  // fp64 [], on the device
};

// Note [Training step warm-up] (training_step.cpp): one forward and backward of `twin` at the
// micro-batch's shape and layout on `training_stream`, to load the GPU's kernels on this thread
// while another thread does other first uses. Errors are left to the first real step.
void warm_up_training_step(TrainableModel& twin, const torch::Device& device, torch::Dtype dtype,
                           bool channels_last, const ModelShape& shape, int64_t micro_batch,
                           c10::Stream training_stream);

}  // namespace hpc_train

// The trainer's state, shared by its two halves: trainer_setup.cpp builds it (the start-up
// phases: communicator, model, optimizer, data, resume) and trainer.cpp runs the epochs on it.
// Private to src/train.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>

#include "hpc_train/comm/comm.h"
#include "hpc_train/error.h"
#include "hpc_train/comm/reducer.h"
#include "hpc_train/data/device_input.h"
#include "hpc_train/data/epoch_batches.h"
#include "hpc_train/data/epoch_plan.h"
#include "hpc_train/data/sample_store.h"
#include "hpc_train/comm/flat_parameters.h"
#include "hpc_train/model/models.h"
#include "hpc_train/monitor/gpu_monitor.h"
#include "hpc_train/monitor/metrics.h"
#include "hpc_train/monitor/run_report.h"
#include "hpc_train/optim/zero_optimizer.h"
#include "hpc_train/train/evaluation.h"
#include "hpc_train/train/graphed_step.h"
#include "hpc_train/train/run_length.h"
#include "hpc_train/train/step_graph.h"
#include "hpc_train/train/trainer.h"
#include "hpc_train/train/training_state.h"
#include "hpc_train/runtime/test_hooks.h"
#include "hpc_train/train/training_step.h"

namespace hpc_train {

// `body`'s result; LibTorch's errors become ours, with LibTorch's own message and without its C++
// backtrace (Trainer's constructor and run()).
template <typename Body>
auto without_libtorch_backtrace(Body&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const c10::Error& e) {
    throw Error(std::string("LibTorch: ") + e.what_without_backtrace());
  }
}

struct RunProgress;    // trainer.cpp: the run in progress
struct EpochProgress;  // trainer.cpp: one epoch in progress

struct Trainer::Impl {
  TrainConfig config;
  const DatasetFile& dataset;
  Communicator comm;
  RunReporter reporter;
  Placement placement;
  torch::Device device;
  torch::Dtype dtype;
  GpuMonitor gpu_monitor;  // NVML samples of this rank's GPU (none on the CPU)
  // Note [Training stream]: from here on (GPU) every step, eager or captured, runs on one
  // non-default stream. It must be current before the Reducer takes the gradient accumulators:
  // an AccumulateGrad node remembers the stream current when it was made, and autograd runs it
  // there. Made on the default stream, it ties the default (legacy) stream into every backward,
  // which a CUDA graph capture refuses ("operation would make the legacy stream depend on a
  // capturing blocking stream"; PyTorch asks DDP to be built on the side stream for the same
  // reason). Declared before the model, so that it is torn down last.
  TrainingStreamScope training_stream;
  std::unique_ptr<TrainableModel> model;
  FlatParameters flat;
  std::optional<Reducer> reducer;
  std::optional<ZeroOptimizer> optimizer;
  std::optional<TrainingStep> step;  // Note [One step]
  std::optional<RunCheckpoints> checkpoints;
  std::optional<DeviceInput> train_input;
  std::optional<Evaluator> evaluator;
  std::optional<SampleStore> store;  // --data-store memory (sample_store.h)
  bool train_split_resident = false;
  // Inputs and convolution weights in NHWC (cuDNN's fast layout on tensor cores; Note
  // [Channels-last weights] in flat_parameters.h)
  bool channels_last = false;
  std::optional<GraphedStep> graphed_step;  // --cuda-graph
  TrainingPosition start;   // where run() begins: zero, or a resumed checkpoint's position
  SampleTrace sample_trace; // test-only (Note [Test hooks])
  std::string resumed_from; // the checkpoint file, empty for a fresh start

  // trainer_setup.cpp
  Impl(const TrainConfig& c, const DatasetFile& d, MPI_Comm mpi_comm, const TrainerOutput& output,
       Placement where, StartupPhases* startup);
  MemoryBytes memory() const;

  // trainer.cpp: run() and the owners of its decisions
  TrainSummary run();
  RunLength plan_run();
  void start_run(RunProgress& run);
  EpochProgress begin_epoch(RunProgress& run, int epoch_index);
  EpochProgress train_epoch(RunProgress& run, int epoch_index);
  bool run_micro_step(EpochBatches& batches, MicroStep micro, RunProgress& run);
  void rebuild_buckets_once();
  bool after_update(RunProgress& run, EpochProgress& epoch, bool replayed, bool have_batch,
                    int64_t batch_size, int window_micro_steps);
  LossSum take_loss_sum(RunProgress& run);
  double log_interval(const StepPosition& at, RunProgress& run);
  void end_epoch(RunProgress& run, const EpochProgress& epoch, const Stopwatch& epoch_wall);
  TrainSummary finish_run(RunProgress& run, const Stopwatch& run_wall);
  TrainingPosition position(const RunProgress& run, int64_t epoch, int64_t micro_steps_in_epoch,
                            int64_t samples_in_epoch);
  EpochTail tail() const;
};

}  // namespace hpc_train

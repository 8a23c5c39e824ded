// The trainer: the epoch loop of data-parallel training around the training step
// (training_step.h), evaluation after every epoch, the log's and the checkpoints' cadence.
#pragma once

#include <ATen/core/Tensor.h>
#include <mpi.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "hpc_train/comm/comm.h"
#include "hpc_train/config/config.h"
#include "hpc_train/data/dataset_file.h"
#include "hpc_train/monitor/run_report.h"
#include "hpc_train/runtime/placement.h"

namespace hpc_train {

class StartupPhases;  // startup_phases.h

// Sets LibTorch's intra-op threads of this process (compute_threads_per_rank in runtime.h).
void set_compute_threads(int threads);

class Trainer {
 public:
  // Builds the model (ConfigError for an unknown name, DataError for a TorchScript file or
  // --init-weights file that cannot be used), moves it into flat storage and broadcasts rank
  // 0's parameters. Collective over `comm`. Marks its phases in `startup` where given (Note
  // [Start-up phases]): communicator, model, optimizer, data, resume.
  Trainer(const TrainConfig& config, const DatasetFile& dataset, MPI_Comm comm,
          const TrainerOutput& output, Placement placement = Placement{},
          StartupPhases* startup = nullptr);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains for config.epochs (or config.max_steps), evaluating after every epoch.
  TrainSummary run();
  // Loss and accuracy on the test split, exact counts over all ranks. Collective.
  EvalResult evaluate();
  // The model's parameters in the logical layout (model order, no padding): a copy.
  at::Tensor flat_parameters() const;
  MemoryBytes memory() const;
  // The reducer's record of the last synchronised backward (overlap test, metrics).
  std::vector<std::pair<std::string, double>> last_reducer_events() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hpc_train

// The trainer: the epoch/step loop of data-parallel training, evaluation, logging cadence.
//
// One step (DESIGN.md, "the corridor"): the loader thread has the rank's next micro-batch in
// host memory -> normalise -> forward -> cross entropy -> backward into the flat gradient buffer
// -> all-reduce and average the gradients (Note [Gradient averaging]) -> Adam/AdamW on the flat
// parameters. Every rank starts from rank 0's parameters, so all ranks stay identical.
#pragma once

#include <ATen/core/Tensor.h>
#include <mpi.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "hpc_train/comm.h"
#include "hpc_train/config.h"
#include "hpc_train/dataset_file.h"
#include "hpc_train/placement.h"

namespace hpc_train {

struct TrainerOutput {
  std::string run_dir;      // rank 0 appends metrics.jsonl here; empty = no files
  bool print = true;        // rank 0 prints progress and epoch lines
  bool progress_bar = false;  // a bar redrawn in place (a terminal) instead of log lines
};

struct EvalResult {
  double loss = 0.0;       // mean cross entropy over the split
  double accuracy = 0.0;   // correct / samples
  int64_t correct = 0;
  int64_t samples = 0;     // summed over ranks: the whole split, each sample once
};

// Bytes this rank holds, by kind (what ZeRO partitions).
struct MemoryBytes {
  int64_t parameters = 0;       // the flat parameter buffer (model dtype)
  int64_t gradients = 0;        // the flat gradient buffer, plus the stage-2 partition
  int64_t optimizer_state = 0;  // Adam moments, plus fp32 master weights when separate
};

// Where a step's time goes, per optimizer step, averaged over the run (milliseconds), and what
// the gradient collectives moved. The phases (forward to optimizer) and the communication
// figures are timed on the host, so only in eager steps (a step replayed from a CUDA graph is
// one launch): they average over phase_timed_steps, data_wait_ms over every step.
struct StepBreakdown {
  int64_t phase_timed_steps = 0;  // the eager steps the phases were timed in
  double data_wait_ms = 0.0;   // blocked on the loader
  double forward_ms = 0.0;
  double backward_ms = 0.0;    // collectives started from the hooks run inside it
  double comm_wait_ms = 0.0;   // exposed communication: waiting after backward
  double optimizer_ms = 0.0;   // unscale, clip, update, all-gather
  double comm_bytes_per_step = 0.0;
  double busbw_gb_s = 0.0;     // nccl-tests' bus bandwidth, a lower bound (see trainer.cpp)
  nlohmann::json to_json() const;
};

struct TrainSummary {
  int world_size = 1;
  std::string model;
  int64_t parameters = 0;
  int epochs_completed = 0;
  int64_t steps = 0;
  int64_t global_batch = 0;
  double final_train_loss = 0.0;  // mean over the last epoch's steps (or those run of it)
  EvalResult test;
  double wall_s = 0.0;            // the whole run, evaluation included
  double samples_per_s = 0.0;     // training samples per second over all ranks, first step excluded
  double ms_per_step = 0.0;       // likewise
  int64_t skipped_steps = 0;      // fp16 overflows
  int64_t graph_replays = 0;      // GPU: steps replayed from the captured CUDA graph (--cuda-graph)
  double loss_scale = 1.0;        // at the end
  MemoryBytes memory;             // rank 0's
  StepBreakdown breakdown;        // rank 0's
  int zero_stage = 0;
  std::string precision;
  std::string placement;          // rank 0's device and backend
  double training_flops_per_sample = 0.0;  // GPU: 3 x the forward's (models.h)
  double mfu = 0.0;               // GPU: model FLOPs utilisation against the GPU's peak; 0 = unknown
  std::vector<int64_t> peak_allocated_bytes_per_rank;  // GPU: LibTorch's allocator peak, by rank
  std::string resumed_from;       // the checkpoint this run continued from; empty = fresh start
  std::string last_checkpoint;    // the last checkpoint written; empty = none
  int stop_signal = 0;            // SIGUSR1/SIGTERM that stopped the run after a checkpoint; 0 = ran to the end
  nlohmann::json to_json() const;
};

// Sets LibTorch's intra-op threads of this process (compute_threads_per_rank in runtime.h).
void set_compute_threads(int threads);

class Trainer {
 public:
  // Builds the model (ConfigError for an unknown name), moves it into flat storage and
  // broadcasts rank 0's parameters. Collective over `comm`.
  Trainer(const TrainConfig& config, const DatasetFile& dataset, MPI_Comm comm,
          TrainerOutput output, Placement placement = Placement{});
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

// The run's state between its tensors and checkpoint files: the model's state_dict, the
// optimizer state, the CPU random state, what a resume takes back from a file (checkpoint.h's
// plain structs), and the run's checkpoints themselves (RunCheckpoints: which one to resume,
// writing, pruning, resuming). The trainer decides when; this unit knows how.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hpc_train/io/checkpoint.h"
#include "hpc_train/comm/comm.h"
#include "hpc_train/config/config.h"
#include "hpc_train/data/dataset_file.h"
#include "hpc_train/optim/loss_scaler.h"
#include "hpc_train/model/models.h"
#include "hpc_train/monitor/run_report.h"
#include "hpc_train/optim/zero_optimizer.h"

namespace hpc_train {

// The model's state_dict (parameters, then buffers) in fp32 on the host, as checkpoints and
// weight exports hold it; integral buffers (num_batches_tracked) stay int64.
std::vector<CheckpointTensor> model_state(const TrainableModel& model);

// What a weights export needs (write_weights_safetensors): the model's identity, its input and
// its state_dict at `global_step`. Not collective.
Checkpoint model_checkpoint(const DatasetInfo& input, const TrainableModel& model,
                            int64_t global_step);

// Adds the optimizer state (gathered, logical layout) and the CPU generator's state.
void add_optimizer_and_rng_state(Checkpoint& checkpoint, const FullOptimizerState& state);

// For a resume from `checkpoint` (read from `path`): throws DataError naming the file when it
// holds another model (another identity: another registry name, or TorchScript of other code)
// or input (check_checkpoint_fits), else copies its buffers into `model` (the parameters follow
// the master weights, ZeroOptimizer::load_full_state) and restores the CPU generator. Returns
// the optimizer state on `device`.
FullOptimizerState restore_model_and_rng(const Checkpoint& checkpoint, const std::string& path,
                                         const DatasetInfo& input, TrainableModel& model,
                                         int64_t flat_numel, const torch::Device& device);

// "fp16, dynamic, scale 1024", "fp16, fixed scale 128", "bf16, no scaling".
std::string describe_loss_scaling(const std::string& precision, bool scaled, bool dynamic,
                                  double scale);

// Batch-norm running statistics are updated by each rank from its own batches; like DDP's
// broadcast_buffers, rank 0's are the model's. They matter in evaluation, exports and
// checkpoints. Collective.
void broadcast_buffers(TrainableModel& model, Communicator& comm);

// A run's checkpoints, in its run directory (checkpoint_files.h). Every rank holds one; the
// calls are collective.
class RunCheckpoints {
 public:
  // Everything passed must outlive this object.
  RunCheckpoints(const TrainConfig& config, const DatasetInfo& input, Communicator& comm,
                 TrainableModel& model, int64_t flat_numel, const torch::Device& device,
                 ZeroOptimizer& optimizer, RunReporter& reporter);

  // --resume: "" starts fresh (returns ""), "auto" takes the run directory's newest complete
  // checkpoint (or "" when there is none), anything else names a file. Rank 0 looks, every
  // rank gets its answer.
  std::string to_resume();

  // Writes the checkpoint of `position` into the run directory (`why`: "periodic", "epoch
  // end", ...), keeps the newest --keep-checkpoints, and reports it. Rank 0's buffers are made
  // every rank's first: write_checkpoint may write any rank's bytes (and their crc32), so every
  // rank passes the same. Returns the file; "" without a run directory (tests).
  std::string save(const TrainingPosition& position, const char* why);

  // Continues from the checkpoint at `path`: parameters and buffers, optimizer state
  // (re-partitioned for this world size), loss scaler (Note [Scaler on resume]) and random
  // state. Returns the position to continue from, in samples of the epoch (Note [Resume
  // position]). A checkpoint of another model or input is a DataError.
  TrainingPosition resume(const std::string& path);

 private:
  Checkpoint make_checkpoint(const TrainingPosition& position);

  const TrainConfig& config_;
  const DatasetInfo& input_;
  Communicator& comm_;
  TrainableModel& model_;
  int64_t flat_numel_;
  torch::Device device_;
  ZeroOptimizer& optimizer_;
  RunReporter& reporter_;
  std::optional<LossScalerOptions> loss_scaling_;  // the run's (fp16)
};

}  // namespace hpc_train

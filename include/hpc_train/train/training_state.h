// The run's state between its tensors and checkpoint files: the model's state_dict, the
// optimizer state, the random state, what a resume takes back from a file (checkpoint.h's
// plain structs), and the run's checkpoints themselves (RunCheckpoints: which one to resume,
// writing, pruning, resuming). The trainer decides when; this unit knows how.
#pragma once

#include <cstdint>
#include <future>
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

// Note [Reused host copy]
// A checkpoint's state is copied from the device into host memory. Memory the process has not
// touched before costs a page fault per 4 KiB page on first write: a fresh copy of simple_cnn's
// 6.5 MB state cost a CPU rank a noticeable time (more where faults are slow, as in a VM), and
// held up a GPU run's steps at every epoch-end checkpoint
// (bench/results-notes.md, Note [Reused host copy]). So the fill_ functions write into what their
// output already holds (vectors keep their capacity), and RunCheckpoints keeps one host copy for
// the whole run: from the second checkpoint on, no new pages.

// The model's state_dict (parameters, then buffers) in fp32 on the host, as checkpoints and
// weight exports hold it; integral buffers (num_batches_tracked) stay int64. Into `state`,
// reusing its entries.
void fill_model_state(const TrainableModel& model, std::vector<CheckpointTensor>& state);

// What a weights export needs (write_weights_safetensors): the model's identity, its input and
// its state_dict at `global_step`. Not collective. The fill_ form writes into `checkpoint`.
void fill_model_checkpoint(const DatasetInfo& input, const TrainableModel& model,
                           int64_t global_step, Checkpoint& checkpoint);
Checkpoint model_checkpoint(const DatasetInfo& input, const TrainableModel& model,
                            int64_t global_step);

// Note [Random state in checkpoints]
// A resume continues exactly only if its random draws go on where the saved run's stood.
// Training draws from LibTorch's default generators: dropout (vgg11_bn, vgg16_bn, scripted
// models) from the CPU generator on the CPU and from the CUDA generator of the rank's device on a
// GPU; the input's augmentation draws none (Note [Augmentation draws] in device_input.h). So a
// checkpoint holds the CPU generator's state and, from a run on a GPU, the CUDA generator's (its
// seed and Philox offset), and a resume sets both on every rank. Checkpoints before format
// version 3 held no CUDA state: a GPU run resumed from one drew step 0's dropout masks again,
// and still does (checkpoint.h).
// Every rank draws the same sequence, as DDP with torch.manual_seed(seed) on every rank does:
// every rank seeds with the same --seed (torch::manual_seed in the trainer) and draws as many
// numbers in every step (every rank's micro-batch has the same size, Note [Gradient averaging]
// in training_step.cpp), so the ranks' masks have the same pattern and differ in what they mask only
// through their samples. Rank 0's state is therefore every rank's: a checkpoint holds it once,
// every rank passes the same contents to write_checkpoint, and restoring it on every rank is
// exact, at the saving run's world size and at another one.
// CUDA graphs: LibTorch advances the host's Philox offset by the whole step's draws at every
// replay, before it launches the graph (its Note [CUDA Graph-safe RNG states]), so the state
// taken after replayed steps is the one eager steps would have left; a failed capture leaves the
// generators as they were before it (Note [Failed capture] in step_graph.h).

// Adds the optimizer state (gathered, logical layout) and the random state of a run on
// `device` (Note [Random state in checkpoints]), reusing `checkpoint`'s vectors.
void add_optimizer_and_rng_state(Checkpoint& checkpoint, const FullOptimizerState& state,
                                 const torch::Device& device);

// For a resume from `checkpoint` (read from `path`): throws DataError naming the file when it
// holds another model (another identity: another registry name, or TorchScript of other code)
// or input (check_checkpoint_fits), or random state that LibTorch's generators refuse, else
// copies its buffers into `model` (the parameters follow the master weights,
// ZeroOptimizer::load_full_state) and restores the generators of a run on `device` (Note
// [Random state in checkpoints]; a CPU run ignores a CUDA state). Returns the optimizer state
// on `device`.
FullOptimizerState restore_model_and_rng(const Checkpoint& checkpoint, const std::string& path,
                                         const DatasetInfo& input, TrainableModel& model,
                                         int64_t flat_numel, const torch::Device& device);

// For an evaluation of `checkpoint` (read from `path`; hpc_train evaluate): throws DataError
// naming the file when it holds another model or input (check_checkpoint_fits), else copies its
// parameters and buffers, the model_state as saved, into `model`.
void restore_model_state(const Checkpoint& checkpoint, const std::string& path,
                         const DatasetInfo& input, TrainableModel& model);

// "fp16, dynamic, scale 1024", "fp16, fixed scale 128", "bf16, no scaling".
std::string describe_loss_scaling(const std::string& precision, bool scaled, bool dynamic,
                                  double scale);

// Batch-norm running statistics are updated by each rank from its own batches; like DDP's
// broadcast_buffers, rank 0's are the model's. They matter in evaluation, exports and
// checkpoints. Collective.
void broadcast_buffers(TrainableModel& model, Communicator& comm);

// Note [Background checkpoint writes]
// Writing a checkpoint's file takes a while: HDF5, then an fsync of the file and its directory
// (for the origin's simple_cnn job, with a checkpoint at every epoch's end, a sizeable share of
// its training time). The steps need not wait for it: once the state is on the host, nothing of
// the training changes it. So a periodic or epoch-end checkpoint gathers the state as before
// (collectively), rank 0 alone copies it to the host (the other ranks keep no copy), and rank 0
// writes the file on a thread of its own while the next steps run: write_checkpoint_file, HDF5's
// POSIX driver and no MPI, under the HDF5 lock like the loader thread's reads. One write is in
// flight at a time: the next save and the run's end wait for it, and there every rank learns
// whether it failed, so a failed write ends the job naming the file at the next checkpoint or at
// the run's end at the latest, and a run never finishes reporting a checkpoint that is not
// complete. A stop signal's checkpoint is written at once (with kAuto's collective MPI-IO where
// HDF5 is parallel): the job is about to end. A crash during a background write leaves what a crash
// during any write leaves (Note [Atomic file write]): the earlier checkpoints and at most a
// temporary file, which --resume auto passes over. The price: rank 0 writes the whole file alone,
// never as one collective MPI-IO write, and keeps a host copy of the state for the rest of the
// run (Note [Reused host copy], which the next checkpoint writes over once this file is
// written). With its checkpoints written so, the origin's job trained in nearly the time it takes
// without any (bench/results-notes.md, Note [Background checkpoint writes]).

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
  // Note [Background checkpoint writes]: with kBackground the state is gathered now (rank 0
  // copies the GPU's tensors to the host) and rank 0 writes the file on a thread of its own
  // while the training goes on; kNow (a stop signal's) has the file complete when it returns.
  // Either first waits for the write still in flight.
  enum class Write { kNow, kBackground };
  std::string save(const TrainingPosition& position, const char* why, Write write);

  // The run starts at optimizer step `step`, from the checkpoint `resumed_from` ("" for a
  // fresh start): checkpoints of a higher step in the run directory are of a branch this run
  // abandons and are moved aside, and `latest` names `resumed_from` (Note [Checkpoint
  // branches] in checkpoint_files.h). Rank 0 acts; the others return at once.
  void start_branch(const std::string& resumed_from, int64_t step);

  // Waits for the background write in flight, if any. Collective: when it failed, every rank
  // throws its Error (naming the file), so the job ends at the latest here; the run calls this
  // before it reports its end.
  void wait_for_writes();

  // Continues from the checkpoint at `path`: parameters and buffers, optimizer state
  // (re-partitioned for this world size), loss scaler (Note [Scaler on resume]) and random
  // state. Returns the position to continue from, in samples of the epoch (Note [Resume
  // position]). A checkpoint of another model or input is a DataError.
  TrainingPosition resume(const std::string& path);

 private:
  // The run's state at `position` in host_copy_ (Note [Reused host copy]); returns it.
  Checkpoint& fill_host_copy(const TrainingPosition& position);

  const TrainConfig& config_;
  const DatasetInfo& input_;
  Communicator& comm_;
  TrainableModel& model_;
  int64_t flat_numel_;
  torch::Device device_;
  ZeroOptimizer& optimizer_;
  RunReporter& reporter_;
  std::optional<LossScalerOptions> loss_scaling_;  // the run's (fp16)
  // The last checkpoint's state on the host (Note [Reused host copy]). A background write reads
  // it until wait_for_writes; declared before background_write_, whose destructor waits.
  Checkpoint host_copy_;
  // Rank 0's background write in flight: its failure's message, "" once written. Its
  // destructor waits for the write, so an error unwinding the run leaves no thread behind.
  std::future<std::string> background_write_;
};

}  // namespace hpc_train

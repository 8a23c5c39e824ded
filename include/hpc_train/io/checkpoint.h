// Checkpoints: where a run stands, in one HDF5 file that a run at any world size and ZeRO stage
// can continue from, and the model's weights exported as safetensors. No LibTorch here: the
// trainer converts tensors to and from these plain structs.
//
// Layout of a checkpoint file (format_version 3; versions 1 and 2 are still read, see below).
// Numbers are little-endian; strings are fixed-length (exactly their bytes, no terminator; an
// empty one has a null dataspace), which a collective MPI-IO write allows and which h5py reads as
// bytes. Metadata is written at HDF5 1.8's format version (superblock 2, object headers 2), so
// every HDF5 from 1.8 on reads it and the metadata is checksummed.
//
//   /                      attributes: format = "hpc_train checkpoint", format_version = 3;
//                          model, precision (strings); channels, height, width, num_classes,
//                          zero_stage, world_size (64-bit integers)
//   /model/<name>          one dataset per state_dict entry under PyTorch's name (the dots are
//                          plain characters to HDF5), in state_dict order: the group tracks the
//                          order in which its links were created. F32 is a 32-bit float dataset,
//                          I64 a 64-bit signed integer one; shape [] is a scalar dataspace
//   /optimizer             attribute steps (Adam's step count)
//   /optimizer/master      1-D 32-bit floats, all of one length: the logical layout (model order,
//   /optimizer/exp_avg     no padding), so that the file does not depend on the world size or
//   /optimizer/exp_avg_sq  the ZeRO stage that wrote it
//   /optimizer/ema         the same, the weights' EMA (--ema-decay; Note [Weight EMA] in
//                          zero_optimizer.h); only in a run that keeps one
//   /training              attributes global_step, micro_step, epoch, micro_steps_in_epoch,
//                          skipped_steps, samples_in_epoch, micro_batch, grad_accum (64-bit
//                          integers; the last three since version 2)
//   /training/config_ini   a string dataset: the resolved configuration, byte for byte
//   /training/rng_state    1-D unsigned 8-bit integers, opaque (may hold 0 elements): the CPU
//                          generator's state
//   /training/cuda_rng_state  likewise, the CUDA generator's state (seed and Philox offset) of a
//                          run on a GPU; 0 elements from a CPU run. Since version 3 (Note [Random
//                          state in checkpoints] in training_state.h)
//   /loss_scaler           attributes enabled (0 or 1), dynamic (0 or 1, since version 2), scale
//                          (64-bit float), hysteresis_left, steps, last_overflow_step,
//                          skipped_steps (64-bit integers)
//
// A version 1 file lacks the attributes that version 2 added; read_checkpoint fills them as
// version 1 runs behaved: samples_in_epoch = -1 and micro_batch = grad_accum = 0 (unknown: the
// trainer then assumes the saving run's micro-batch and accumulation were its own), dynamic =
// enabled (version 1 restored any saved scaler). A file before version 3 lacks
// /training/cuda_rng_state: it reads as empty, and a resume from it leaves the CUDA generator as
// the run's seed set it, as those versions' resumes did.
//
// Every dataset has an attribute crc32 (unsigned 32-bit: zlib's CRC-32 of the dataset's bytes as
// stored, little-endian): HDF5 checksums its metadata but not the data, and a flipped bit in the
// master weights must not resume silently.
//
// Files live in <run_dir>/checkpoints as step-<global step, 8 digits or more>.h5
// (checkpoint_files.h). A write goes to "<name>.tmp" first and is renamed when complete
// (Note [Atomic file write]), so a crash leaves the earlier files as they were and at most one
// temporary file, which readers ignore and prune_checkpoints deletes.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hpc_train/optim/loss_scaler.h"

namespace hpc_train {

inline constexpr int kCheckpointFormatVersion = 3;
inline constexpr int kOldestReadableCheckpointFormatVersion = 1;

// One tensor of the model's state_dict (parameters and buffers), under PyTorch's name.
struct CheckpointTensor {
  std::string name;            // e.g. "conv1.weight", "bn1.running_mean", "bn1.num_batches_tracked"
  std::string dtype;           // "F32" or "I64" (safetensors names)
  std::vector<int64_t> shape;  // empty = scalar
  std::vector<uint8_t> data;   // little-endian, row-major
};

// Where training stands. Note [Resume position]: what is the same at every world size,
// micro-batch and accumulation is how far into the epoch's permutation (epoch_plan.h) training
// got: micro-step j of every rank covers positions [j*b*W, (j+1)*b*W) of it, so after m
// micro-steps the ranks together have consumed its first samples_in_epoch = m*b*W positions.
// A resume at any other W', b' continues at that position (rank_epoch_indices' first_position);
// checkpoints fall on optimizer-step boundaries, so its first update is a whole one.
struct TrainingPosition {
  int64_t global_step = 0;           // optimizer steps taken or skipped
  int64_t micro_step = 0;            // micro-batches over the whole run
  int64_t epoch = 0;                 // 0-based epoch in progress (or the next one, at an epoch end)
  int64_t micro_steps_in_epoch = 0;  // micro-batches of `epoch` this rank consumed (at micro_batch)
  int64_t skipped_steps = 0;         // fp16 overflows so far
  int64_t samples_in_epoch = 0;      // positions of `epoch`'s permutation consumed by all ranks;
                                     // -1: unknown (a version 1 file)
  int64_t micro_batch = 1;           // of the run that saved it; 0: unknown (version 1)
  int64_t grad_accum = 1;            // likewise
};

struct Checkpoint {
  int format_version = kCheckpointFormatVersion;
  std::string model;  // TrainableModel::identity(): "simple_cnn", "TorchScript content 01ab..."
  int64_t channels = 0, height = 0, width = 0, num_classes = 0;  // the input it was built for
  std::string precision;                                         // fp32 | fp16 | bf16
  int zero_stage = 0;
  int world_size = 0;      // at save time; informational (resume may differ)
  std::string config_ini;  // the resolved configuration (to_ini)
  TrainingPosition position;
  int64_t optimizer_steps = 0;   // Adam's step count (bias correction)
  bool has_loss_scaler = false;  // fp16
  bool loss_scaler_dynamic = false;  // the saved scaler was a dynamic one (not --loss-scale N)
  LossScalerState loss_scaler;
  std::vector<uint8_t> rng_state;             // opaque (LibTorch's CPU generator); may be empty
  std::vector<uint8_t> cuda_rng_state;        // opaque (LibTorch's CUDA generator); may be empty
  std::vector<CheckpointTensor> model_state;  // state_dict order
  // fp32, the logical layout: model order, no padding, all the same length.
  std::vector<float> master, exp_avg, exp_avg_sq;
  std::vector<float> ema;  // the same layout; empty: the run kept no EMA
};

// How write_checkpoint moves the data into the file.
enum class CheckpointWriteMode {
  kAuto,        // kCollective where the HDF5 library is parallel, else kRankZero
  kCollective,  // MPI-IO: every rank writes its contiguous 1/W share of master, exp_avg and
                // exp_avg_sq in one collective transfer; rank 0 writes the rest
  kRankZero,    // rank 0 writes the whole file (HDF5's POSIX driver) while the others wait
};

// Note [Checkpoint space]
// A full disk (or a quota) must end a run with an error naming the checkpoint, the earlier
// checkpoints and `latest` as they were (the temporary file removed, Note [Atomic file write]).
// HDF5 1.10 does not survive one on its own: once a flush of its metadata cache fails (the one in
// H5Fclose too), the cache stays half-flushed ("slist already enabled?"), no later flush or close
// gets the file out, and the library's teardown at MPI_Finalize dereferences it: the job died
// with signal 11 (exit 139) instead of an error. A failure in a write of the data is survivable,
// if the close that follows cannot fail. So a checkpoint's writer
//  1. checks the file system's free space (statvfs) against an upper bound of the file's size
//     (the data plus an allowance for HDF5's metadata) before any file exists: the common case
//     ends there, with "it takes about X and DIR has Y free", on every rank alike;
//  2. with HDF5's POSIX driver, reserves that much for the new file (fallocate, keeping its
//     size) right after creating it, which a quota or a competing writer may still refuse, and
//     before the flush reserves whatever the file has grown to beyond it, so that the flush
//     writes on blocks the file holds; the reservation past the file's end goes back once it is
//     written. A file system that cannot reserve is left to step 1;
//  3. with the POSIX driver, closes a file it gives up on (any failure before the flush) with its
//     descriptor pointed at an anonymous memory file, so that what the close still writes
//     succeeds and HDF5 stays usable (the next checkpoint, the loader's reads, the teardown).
// What remains: a flush that fails all the same (an I/O error, or a full disk that cannot
// reserve and filled up after step 1). A collective MPI-IO write has step 1 only; a failure
// after it may end the job with MPI_Abort (write_checkpoint's comment).

// Collective over `comm`. Every rank passes the same contents. Writes `path` atomically: under a
// temporary name in the same directory, fsynced, renamed over `path`, directory fsynced; when it
// returns on any rank the file is complete under `path` (with kRankZero, rank 0 may replace an
// existing `path` before the other ranks enter the call). Creates the file's directory when it
// is missing. kCollective needs a directory that every rank sees (a shared file system across
// nodes). Throws Error naming the file on failure: a malformed checkpoint (a dtype other than F32
// or I64, data that does not fill its shape, a name HDF5 cannot hold, optimizer arrays of
// unequal lengths), too little space (Note [Checkpoint space]) and a failed write. With
// kRankZero every rank throws the same error; with
// kCollective a failure that only some ranks meet (a full disk) throws on those ranks at once,
// while the others may wait in a collective until the job ends (Note [Ending the job] in
// runtime.h): the previous files stay as they were either way.
void write_checkpoint(MPI_Comm comm, const std::string& path, const Checkpoint& checkpoint);
void write_checkpoint(MPI_Comm comm, const std::string& path, const Checkpoint& checkpoint,
                      CheckpointWriteMode mode);

// The file of write_checkpoint's kRankZero mode, written by this process alone and without MPI,
// so that a thread beside the training can write it (RunCheckpoints' background writes): the
// same checks, the same atomic steps, the same file. Throws Error naming the file on failure.
void write_checkpoint_file(const std::string& path, const Checkpoint& checkpoint);

// Reads and validates (any rank, no MPI): format marker and version, every field present, sizes
// consistent (master/exp_avg/exp_avg_sq equal lengths; each model tensor's bytes = product(shape)
// x dtype size), every dataset's crc32. Throws DataError naming the file and what is wrong for: a
// missing file, a file that is not HDF5, an HDF5 file that is not an hpc_train checkpoint (e.g. a
// dataset file), an unknown format version, a truncated or corrupt file.
Checkpoint read_checkpoint(const std::string& path);

// Throws DataError naming the file when `checkpoint` cannot continue this run: another model
// name, another input shape/classes, or model tensors whose names/shapes differ from `expected`
// (name -> shape, in order), or a master length != expected_numel. Says what the checkpoint holds
// and what the run has.
void check_checkpoint_fits(
    const Checkpoint& checkpoint, const std::string& path, const std::string& model,
    int64_t channels, int64_t height, int64_t width, int64_t num_classes,
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& expected,
    int64_t expected_numel);

// Note [Scaler on resume]: a checkpoint's loss-scaler state continues only a run that scales the
// same way: both fp16 with dynamic scaling. Anything else (fp16 -> bf16, bf16 -> fp16,
// fp32 -> fp16, a fixed --loss-scale on either side, or a changed one) starts the scaler the run's
// own configuration asks for; a bf16 or fp32 run then has no scale at all (1), on the CPU and
// the GPU alike. `run_scaling`: the run's fp16 scaling, absent for bf16 and fp32.
bool continues_loss_scaler(const Checkpoint& checkpoint,
                           const std::optional<LossScalerOptions>& run_scaling);

// The model's weights as safetensors (write_safetensors from safetensors.h): model_state under its
// names (F32; I64 for num_batches_tracked, shape []), metadata format="hpc_train weights", model,
// channels, height, width, num_classes (decimal strings) and step (global_step). Uses only model,
// shape, position and model_state of `checkpoint`. Throws Error naming the file.
void write_weights_safetensors(const std::string& path, const Checkpoint& checkpoint);

}  // namespace hpc_train

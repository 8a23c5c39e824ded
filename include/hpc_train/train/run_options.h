// The configuration mapped onto each part's options: one place that knows which --option feeds
// which part of the step (the parts themselves know nothing of TrainConfig).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <optional>

#include "hpc_train/config/config.h"
#include "hpc_train/data/dataset_file.h"
#include "hpc_train/optim/loss_scaler.h"
#include "hpc_train/optim/lr_schedule.h"
#include "hpc_train/comm/reducer.h"
#include "hpc_train/optim/zero_optimizer.h"
#include "hpc_train/runtime/placement.h"

namespace hpc_train {

// The parameters' dtype (--precision): fp16 and bf16 keep the model in half precision, with
// fp32 master weights in the optimizer.
torch::Dtype model_dtype(const TrainConfig& config);

// Note [Bucket size at ZeRO-2]
// --bucket-mb 0 (the default) picks the bucket cap: 25 MiB, as DDP; but where ZeRO-2 partitions
// the gradients (stage 2 across ranks), whose staging ring holds two buckets (Note [Partitioned
// gradients] in reducer.h), an eighth of the model's gradient bytes, at most 4 MiB. With 25 MiB
// buckets the ring would hold more than resnet18's whole bf16 gradient (22 MB), and stage 2 would
// keep more gradient memory than stage 1; with an eighth it keeps full/N + full/4 at most (less
// than stage 1's full from 2 ranks on), and from 32 MiB of gradients on, full/N + 8 MiB. NCCL
// moves a 4 MiB bucket near its peak bandwidth, and smaller buckets start their collectives
// earlier in backward; a small model's more collectives are short ones.
inline constexpr double kMaxPartitionedBucketMiB = 4.0;
inline constexpr int kPartitionedBucketsPerGradient = 8;
// The bucket cap in MiB: --bucket-mb, or the default above for `world_size` ranks and a model
// whose gradients are `gradient_bytes` (in the dtype the collectives move).
double bucket_mib(const TrainConfig& config, int world_size, int64_t gradient_bytes);

// --bucket-mb (bucket_mib), --first-bucket-mb, --overlap-comm; the ZeRO stage's reduction;
// --grad-accum-dtype (with --grad-accum > 1) and --comm-dtype; for `world_size` ranks and a
// model of `parameters` elements.
ReducerOptions reducer_options(const TrainConfig& config, int world_size, int64_t parameters);

// fp16's loss scaling (--loss-scale 0: dynamic, from 2^--initial-scale-power); none otherwise.
std::optional<LossScalerOptions> loss_scaling(const TrainConfig& config);

// --optimizer and its hyper-parameters.
OptimizerOptions optimizer_options(const TrainConfig& config);

// The partitioned optimizer: stage, the update rule, clipping, and fp16's overflow check and
// scaling.
ZeroOptions zero_options(const TrainConfig& config);

// The LR schedule of a run of `run_steps` optimizer steps (--schedule-steps, when given, sets
// the cosine's or decay's end instead; one-cycle's 0 steps are half the run each way), whose
// epochs have `micro_steps_per_epoch` micro-steps each (--lr-milestone-epochs become the steps
// that end those epochs: micro-steps carry over epoch boundaries with --grad-accum).
LrScheduleParams lr_schedule_options(const TrainConfig& config, int64_t run_steps,
                                     int64_t micro_steps_per_epoch);

// Note [cuDNN autotuning]: --cudnn-benchmark times cuDNN's candidate algorithms for every new
// input shape. For resnet18 that takes seconds per shape, after which its replayed step ran faster
// than with cuDNN's heuristics. Tuning every shape also tuned the epoch's last, partial batch and
// the evaluation batches, inside the timed steps: one partial batch's tuning made the benchmark's
// resnet18 row much slower (bench/results-notes.md, Note [cuDNN autotuning]). So only the full
// micro-batch is tuned (in the eager steps before the capture, which then finds its algorithms
// chosen); other shapes, a few steps per epoch, and evaluation take the heuristics.
// Whether cuDNN autotunes the convolutions of a training micro-batch of `batch_size` samples.
bool cudnn_autotunes(const TrainConfig& config, int64_t batch_size);

// Whether the steps are captured as a CUDA graph and replayed (--cuda-graph): auto where the
// build, the device, the backend (not MPI's host staging) and --grad-accum 1 allow it. Throws
// ConfigError for --cuda-graph on where they do not.
bool capture_steps(const TrainConfig& config, const Placement& placement);

// Note [Resident splits and GPU memory]: whether the train split is kept on the device
// (--resident-data). `gpu`: the rank's GPU's memory (gpu_memory), nullopt on the CPU. On: yes,
// but where the split alone needs more than the GPU has free the upload could only fail with
// CUDA's out-of-memory error, so that is a ConfigError naming the sizes. Auto: on a GPU without
// the read-once store (Note [Store and resident data] in config.cpp: with a store, auto keeps
// nothing resident), for a split of at most kAutoResidentBytes, a quarter of the GPU's memory
// and half of what is free on it (a quarter of a 16 GB card is 4 GB: the model, its activations
// and other processes keep the rest).
inline constexpr int64_t kAutoResidentBytes = int64_t{4} << 30;  // CIFAR-10 takes 154 MB
inline constexpr int64_t kAutoResidentShareOfGpu = 4;            // at most total / 4
inline constexpr int64_t kAutoResidentShareOfFree = 2;           // and free / 2
bool keep_train_split_resident(const TrainConfig& config, const DatasetInfo& info,
                               const std::optional<GpuMemory>& gpu);
// Whether evaluation keeps the test split on the device too, where the train split is: on where
// both splits fit the GPU's free memory, auto where both together are within auto's bound.
// Every evaluation then gathers its batches there instead of reading the file again (one read
// at start-up); otherwise evaluation reads the test split from the file.
bool keep_test_split_resident(const TrainConfig& config, const DatasetInfo& info,
                              const std::optional<GpuMemory>& gpu);

// Note [Evaluation batch]: evaluation keeps no activations for a backward pass, so on a GPU its
// batches can be much larger than training's, and each batch costs about twenty launches whatever
// its size: the origin's evaluation (40 batches of 256) and epoch end took many times as long an
// epoch as its arithmetic (well under a millisecond) needs. --eval-batch gives the size; auto (0)
// takes, on a GPU, as many samples as kAutoEvalInputBytes of float32 input hold, from 256 (large
// images) to 4096 (Fashion-MNIST: 3 batches of the test split instead of 40). On the CPU, where a
// batch costs no launches and large ones fall out of the caches (the origin's evaluation ran
// slower in batches of 4096 than in batches of 256; this and the GPU's figure:
// bench/results-notes.md, Note [Evaluation batch]), auto stays at 256. A batch never exceeds a
// rank's share of the split evaluated (`split`: training's is the test split; hpc_train evaluate
// may take the train split), so small splits stage no unused buffers. The results do not depend
// on the size beyond the sums' order.
inline constexpr int64_t kAutoEvalInputBytes = int64_t{16} << 20;
inline constexpr int64_t kMinAutoEvalBatch = 256;  // and the CPU's
inline constexpr int64_t kMaxAutoEvalBatch = 4096;
int64_t evaluation_batch(const TrainConfig& config, const DatasetInfo& info, int world_size,
                         bool cuda, Split split = Split::kTest);

}  // namespace hpc_train

// Evaluation: loss and accuracy of the model on a split, exact over all ranks. Each rank takes
// its uneven share of the split in order (EpochTail::kUneven: every sample once, no padding),
// in batches larger than training's (Note [Evaluation batch] in run_options.h), all of one
// shape (Note [One evaluation shape]), sums loss and correct answers on the device, and the
// sums are all-reduced. The split is read from the file every evaluation, or kept on the device
// once (keep_split_resident, where the train split is: keep_test_split_resident in
// run_options.h), which gives the same batches (DeviceInput's resident mode) without the
// per-epoch reads.
//
// Note [One evaluation shape]
// A GPU meets every new input shape with new work: LibTorch asks cuDNN for a plan per
// convolution and shape, and CUDA loads the kernels of those plans on their first launch: the
// origin's first evaluation (batches of 4096 and 1808) took noticeably longer than the others. So
// every batch of a rank's evaluation has the evaluation batch's size, the last one filled up with
// copies of the share's last sample, whose outputs are left out of the sums (10000 samples in
// batches of 4096: the third holds the last 1808 and 2288 copies). The CPU, where shapes cost
// nothing ahead, fills up too (at most one batch less one sample more to compute an evaluation),
// so that one path serves both and the CPU's tests check it. On a GPU the trainer's check that the
// model runs (check_runs_in) runs at that shape (sample_input), and the sums on its output
// (warm_up), during the start-up: the first evaluation then finds its plans ready and its kernels
// loaded (CUDA loads a library's kernels on their first launch: several libraries for the loss,
// argmax and sums of the origin's first evaluation). Equal batches (three of 3334) would fill up
// less, but cost more an epoch than 4096, 4096 and 1808
// (bench/results-notes.md, Note [One evaluation shape]): the evaluation batch, a power of two by
// default, is the shape kept.

//
// Note [Evaluation sums]
// What an evaluation counts stays on the device until the rank's share is done, so that no
// batch waits for the GPU: the summed loss (fp64), the confusion matrix (int64, classes x
// classes, by the top-1 class), whose diagonal is the correct answers and whose rows give each
// class's accuracy, and the top-5 hits (Note [Top-5 accuracy] in run_report.h). At the end they
// come to the host once and are summed over the ranks in one all-reduce of doubles, exact for
// counts below 2^53.

#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "hpc_train/comm/comm.h"
#include "hpc_train/data/dataset_file.h"
#include "hpc_train/data/device_input.h"
#include "hpc_train/model/models.h"
#include "hpc_train/monitor/run_report.h"

namespace hpc_train {

// The device-side sums of an evaluation (Note [Evaluation sums]).
class EvalSums {
 public:
  EvalSums(int64_t num_classes, c10::Device device);

  // Adds the first `count` rows of `logits` ([B, num_classes], any floating dtype) and of
  // `labels` (int64 [B]).
  void add(const torch::Tensor& logits, const torch::Tensor& labels, int64_t count);

  // The sums of every rank, each of which counted `samples`. Collective over `comm`.
  EvalResult reduce(Communicator& comm, int64_t samples) const;

 private:
  int64_t num_classes_;
  torch::Tensor loss_total_;    // fp64 []
  torch::Tensor correct_top5_;  // int64 []; undefined below kTopKClasses classes
  torch::Tensor confusion_;     // int64 [num_classes * num_classes], row = label
};

// Every sample's prediction (hpc_train evaluate's predictions.csv), on rank 0, in split order.
struct SplitPredictions {
  int64_t top_classes_per_sample = 0;  // min(kTopKClasses, classes)
  std::vector<int64_t> index;          // the sample's index in the split, ascending
  std::vector<int64_t> label;
  std::vector<int64_t> predicted;      // the top-1 class (argmax, as the accuracy counts it)
  // [samples x top_classes_per_sample], row-major: the most likely classes, most likely first
  // (topk; it differs from `predicted` only among equal logits), and their softmax
  // probabilities (fp32).
  std::vector<int64_t> top_classes;
  std::vector<float> top_probabilities;
};

class Evaluator {
 public:
  // Input like training's (`device`, `dtype`, `channels_last`), without augmentation, in
  // batches of `batch_samples`. `dataset` and `comm` must outlive the evaluator.
  Evaluator(const DatasetFile& dataset, Split split, c10::Device device, c10::ScalarType dtype,
            bool channels_last, uint64_t seed, int64_t batch_samples, int prefetch_batches,
            Communicator& comm);

  // Makes rank 0's buffers (BatchNorm statistics) every rank's, as DDP does, then evaluates
  // `model` in eval mode. With `predictions`, rank 0's receives every sample's (the others'
  // stays empty): their rows come to the host with the sums and go to rank 0 at the end.
  // Collective.
  EvalResult evaluate(TrainableModel& model, SplitPredictions* predictions = nullptr);

  // Reads the split once and keeps it on the device; every evaluate() then gathers from it.
  void keep_split_resident();

  // Zeros in the shape, dtype, device and layout of every batch this rank's evaluate() gives
  // the model (Note [One evaluation shape]).
  torch::Tensor sample_input() const;

  // Runs the sums of evaluate() on `logits`, the model's output for sample_input(), and drops
  // them: on a GPU their kernels load now rather than in the first evaluation (Note [One
  // evaluation shape]).
  void warm_up(const torch::Tensor& logits) const;

 private:

  const DatasetFile& dataset_;
  Split split_;
  c10::Device device_;
  c10::ScalarType dtype_;
  bool channels_last_;
  uint64_t seed_;
  int64_t batch_samples_;  // every batch's size (Note [Evaluation batch] in run_options.h)
  int prefetch_batches_;
  Communicator& comm_;
  DeviceInput input_;
  bool resident_ = false;
};

}  // namespace hpc_train

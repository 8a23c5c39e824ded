// Evaluation: loss and accuracy of the model on a split, exact over all ranks. Each rank takes
// its uneven share of the split in order (EpochTail::kUneven: every sample once, no padding),
// in batches of its own size, larger than training's (Note [Evaluation batch] in
// run_options.h), sums loss and correct answers on the device, and the sums are all-reduced.
// The split is read from the file every evaluation, or kept on the device once
// (keep_split_resident, where the train split is: keep_test_split_resident in run_options.h),
// which gives the same batches (DeviceInput's resident mode) without the per-epoch reads.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>

#include "hpc_train/comm/comm.h"
#include "hpc_train/data/dataset_file.h"
#include "hpc_train/data/device_input.h"
#include "hpc_train/model/models.h"
#include "hpc_train/monitor/run_report.h"

namespace hpc_train {

class Evaluator {
 public:
  // Input like training's (`device`, `dtype`, `channels_last`), without augmentation, in
  // batches of `batch_samples` (the last one a rank's remainder). `dataset` and `comm` must
  // outlive the evaluator.
  Evaluator(const DatasetFile& dataset, Split split, c10::Device device, c10::ScalarType dtype,
            bool channels_last, uint64_t seed, int64_t batch_samples, int prefetch_batches,
            Communicator& comm);

  // Makes rank 0's buffers (BatchNorm statistics) every rank's, as DDP does, then evaluates
  // `model` in eval mode. Collective.
  EvalResult evaluate(TrainableModel& model);

  // Reads the split once and keeps it on the device; every evaluate() then gathers from it.
  void keep_split_resident();

 private:
  const DatasetFile& dataset_;
  Split split_;
  c10::Device device_;
  bool channels_last_;
  uint64_t seed_;
  int64_t batch_samples_;
  int prefetch_batches_;
  Communicator& comm_;
  DeviceInput input_;
  bool resident_ = false;
};

}  // namespace hpc_train

// Input for one epoch of training: the rank's micro-batches on the device, in the order of its
// epoch plan (epoch_plan.h), each one's copy started while the step before it runs
// (device_input.h); from the loader thread, gathered from the split kept resident on the
// device, or exchanged from the ranks' read-once store (sample_store.h).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "hpc_train/data/batch_loader.h"
#include "hpc_train/data/dataset_file.h"
#include "hpc_train/data/device_input.h"
#include "hpc_train/data/sample_store.h"

namespace hpc_train {

class EpochBatches {
 public:
  // `indices`: the rank's epoch plan from the first batch not yet consumed, which is batch
  // `first_batch` of the epoch (a resumed epoch starts later; the augmentation draws follow
  // the batch's place in the whole epoch). `input` and `dataset` must outlive this.
  // The batches come from the resident split (`resident`), else from `store` where one is given
  // (its start_epoch returned `indices`; every prepare_next is then a collective exchange),
  // else from a loader thread.
  EpochBatches(DeviceInput& input, const DatasetFile& dataset, std::vector<int64_t> indices,
               int64_t batch_size, int prefetch_batches, int64_t epoch, int64_t first_batch,
               bool resident, SampleStore* store = nullptr);

  // Micro-batches in the plan.
  int64_t batches() const;
  // Stages the next batch; false after the epoch's last. Time blocked on the loader adds to
  // *wait_ms.
  bool prepare_next(double* wait_ms);
  // The size of the batch staged first and not yet taken.
  int64_t prepared_size() const { return prepared_.front().second - prepared_.front().first; }
  DeviceBatch take();
  // The staged batch written into caller-owned tensors (DeviceInput::take_into): a CUDA graph's
  // input buffers.
  void take_into(at::Tensor& input, at::Tensor& labels);
  // The dataset indices of the batch taken last.
  std::vector<int64_t> taken_indices() const;
  double loader_wait_ms() const { return loader_ ? loader_->wait_ms() : 0.0; }

 private:
  DeviceInput& input_;
  int64_t batch_size_;
  int64_t epoch_;
  int64_t first_batch_;
  std::vector<int64_t> indices_;  // the plan (the loader reads a copy)
  std::optional<BatchLoader> loader_;
  SampleStore* store_ = nullptr;
  HostBatch host_batch_;
  std::deque<std::pair<int64_t, int64_t>> prepared_;  // [begin, end) in indices_, staged in order
  std::pair<int64_t, int64_t> taken_{0, 0};
  int64_t batches_prepared_ = 0;
};

}  // namespace hpc_train

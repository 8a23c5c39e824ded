#include "hpc_train/data/epoch_batches.h"

#include <algorithm>
#include <string>

#include "hpc_train/data/epoch_plan.h"
#include "hpc_train/error.h"
#include "hpc_train/monitor/metrics.h"

namespace hpc_train {

EpochBatches::EpochBatches(DeviceInput& input, const DatasetFile& dataset,
                           std::vector<int64_t> indices, int64_t batch_size, int prefetch_batches,
                           int64_t epoch, int64_t first_batch, bool resident, SampleStore* store)
    : input_(input), batch_size_(batch_size), epoch_(epoch), first_batch_(first_batch),
      indices_(std::move(indices)), store_(resident ? nullptr : store) {
  if (!resident && store_ == nullptr)
    loader_.emplace(dataset, Split::kTrain, indices_, batch_size, prefetch_batches);
}

int64_t EpochBatches::batches() const {
  return batches_per_epoch(static_cast<int64_t>(indices_.size()), batch_size_);
}

bool EpochBatches::prepare_next(double* wait_ms) {
  const int64_t index = first_batch_ + batches_prepared_;
  const int64_t begin = batches_prepared_ * batch_size_;
  if (begin >= static_cast<int64_t>(indices_.size())) return false;
  const int64_t end = std::min<int64_t>(begin + batch_size_, indices_.size());
  if (loader_ || store_) {
    Stopwatch wait;
    if (store_) {
      store_->exchange(batches_prepared_, batch_size_, host_batch_);
    } else if (!loader_->next(host_batch_)) {
      throw Error("the loader ended before the epoch plan did");
    }
    *wait_ms += wait.elapsed_ms();
    host_batch_.index_in_epoch = index;
    input_.prepare(host_batch_, epoch_);
  } else {
    input_.prepare_resident(std::vector<int64_t>(indices_.begin() + begin, indices_.begin() + end),
                            index, epoch_);
  }
  prepared_.emplace_back(begin, end);
  ++batches_prepared_;
  return true;
}

DeviceBatch EpochBatches::take() {
  DeviceBatch batch = input_.take();
  taken_ = prepared_.front();
  prepared_.pop_front();
  return batch;
}

void EpochBatches::take_into(at::Tensor& input, at::Tensor& labels) {
  input_.take_into(input, labels);  // throws for a short batch, which then stays staged
  taken_ = prepared_.front();
  prepared_.pop_front();
}

std::vector<int64_t> EpochBatches::taken_indices() const {
  return std::vector<int64_t>(indices_.begin() + taken_.first, indices_.begin() + taken_.second);
}

}  // namespace hpc_train

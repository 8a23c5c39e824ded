#include "hpc_train/data/batch_loader.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "hpc_train/data/epoch_plan.h"
#include "hpc_train/error.h"

namespace hpc_train {

namespace {

size_t checked_capacity(int prefetch_batches) {
  if (prefetch_batches < 1)
    throw Error("prefetch_batches = " + std::to_string(prefetch_batches) + ", expected >= 1");
  return static_cast<size_t>(prefetch_batches);
}

}  // namespace

BatchLoader::BatchLoader(const DatasetFile& file, Split split, std::vector<int64_t> indices,
                         int64_t batch_size, int prefetch_batches)
    : file_(file),
      split_(split),
      indices_(std::move(indices)),
      batch_size_(batch_size),
      capacity_(checked_capacity(prefetch_batches)),
      num_batches_(batches_per_epoch(static_cast<int64_t>(indices_.size()), batch_size)),
      thread_(&BatchLoader::run, this) {}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  // Returns after at most the one read in progress: the thread checks stop_ between batches.
  if (thread_.joinable()) thread_.join();
}

int64_t BatchLoader::num_batches() const { return num_batches_; }

void BatchLoader::run() {
  try {
    for (int64_t b = 0; b < num_batches_; ++b) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return stop_ || ready_.size() < capacity_; });
        if (stop_) return;
      }
      // Read without holding the queue lock, so that next() can hand out earlier batches.
      const int64_t begin = b * batch_size_;
      const int64_t end = std::min(begin + batch_size_, static_cast<int64_t>(indices_.size()));
      const std::vector<int64_t> batch_indices(indices_.begin() + begin, indices_.begin() + end);
      HostBatch batch;
      batch.index_in_epoch = b;
      batch.size = end - begin;
      batch.images.resize(static_cast<size_t>(batch.size * file_.info().sample_bytes()));
      batch.labels.resize(static_cast<size_t>(batch.size));
      file_.read_samples(split_, batch_indices, batch.images.data(), batch.labels.data());
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ready_.push_back(std::move(batch));
      }
      changed_.notify_all();
    }
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
    }
    changed_.notify_all();
  }
}

bool BatchLoader::next(HostBatch& batch) {
  if (delivered_ >= num_batches_) return false;
  std::unique_lock<std::mutex> lock(mutex_);
  if (ready_.empty() && !error_) {
    const auto start = std::chrono::steady_clock::now();
    changed_.wait(lock, [&] { return !ready_.empty() || error_; });
    wait_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                    .count();
  }
  // Batches read before a failure are still handed out, in order; then the error.
  if (ready_.empty()) std::rethrow_exception(error_);
  batch = std::move(ready_.front());
  ready_.pop_front();
  ++delivered_;
  lock.unlock();
  changed_.notify_all();
  return true;
}

}  // namespace hpc_train

// The loader: a thread that reads the rank's batches of one epoch ahead of the training loop,
// so that reading overlaps compute. Batches come out in plan order; an error on the thread
// (a bad label, a read failure) is rethrown by next().
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "hpc_train/data/dataset_file.h"

namespace hpc_train {

// One batch in host memory: uint8 images [size, C, H, W] and int64 labels.
struct HostBatch {
  int64_t index_in_epoch = 0;  // 0, 1, 2, ...
  int64_t size = 0;            // samples in this batch (the epoch's last may be smaller)
  std::vector<uint8_t> images;
  std::vector<int64_t> labels;
};

class BatchLoader {
 public:
  // Starts the thread at once. `indices` is this rank's epoch plan; `file` must outlive the loader.
  BatchLoader(const DatasetFile& file, Split split, std::vector<int64_t> indices,
              int64_t batch_size, int prefetch_batches);
  ~BatchLoader();  // stops and joins the thread; never throws
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  int64_t num_batches() const;
  // The next batch, in order; false after the last one. Blocks while the thread is behind.
  bool next(HostBatch& batch);
  // Time the caller spent blocked in next(), summed, in milliseconds (exposed data wait).
  double wait_ms() const { return wait_ms_; }

 private:
  void run();

  const DatasetFile& file_;
  Split split_;
  std::vector<int64_t> indices_;
  int64_t batch_size_;
  size_t capacity_;
  int64_t num_batches_;
  int64_t delivered_ = 0;
  double wait_ms_ = 0.0;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<HostBatch> ready_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;  // last: started after everything above is set up
};

}  // namespace hpc_train

// A few threads that run one batch of independent reads at a time, so that several reads are in
// flight where the caller would otherwise wait for each in turn (Note [Reads in flight]).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

namespace hpc_train {

// The range of --reader-threads (reads in flight per rank), checked by config and by the pool.
constexpr int kMinReaderThreads = 1;
constexpr int kMaxReaderThreads = 64;

class ReaderThreads {
 public:
  // `reads_in_flight` in [kMinReaderThreads, kMaxReaderThreads], else throws Error: the caller of
  // run() takes part, so the pool starts reads_in_flight - 1 threads (none for 1).
  explicit ReaderThreads(int reads_in_flight);
  ~ReaderThreads();  // joins the threads; never throws
  ReaderThreads(const ReaderThreads&) = delete;
  ReaderThreads& operator=(const ReaderThreads&) = delete;

  int reads_in_flight() const { return static_cast<int>(threads_.size()) + 1; }

  // Runs read(0) ... read(count - 1), each once, on the pool's threads and the caller's, and
  // returns when all have returned. The reads must be independent (they may run in any order
  // and at once). Where some throw, rethrows the exception of the lowest index: the one that
  // running them in order would have thrown. Thread-safe: concurrent callers take turns.
  void run(size_t count, const std::function<void(size_t)>& read);

 private:
  void serve();
  void take_reads(std::unique_lock<std::mutex>& lock);

  std::mutex turn_;  // held by the caller whose batch the pool runs
  std::mutex mutex_;  // guards everything below
  std::condition_variable work_;  // a batch has reads left, or stop_
  std::condition_variable done_;  // the batch's last read returned
  const std::function<void(size_t)>* read_ = nullptr;  // the batch's reads; null between batches
  size_t count_ = 0;
  size_t next_ = 0;     // the next read to start
  size_t unfinished_ = 0;  // reads of the batch that have not returned yet
  size_t error_index_ = std::numeric_limits<size_t>::max();
  std::exception_ptr error_;  // the exception of read(error_index_)
  bool stop_ = false;
  std::vector<std::thread> threads_;  // last: started after everything above is set up
};

}  // namespace hpc_train

#include "hpc_train/io/reader_threads.h"

#include <string>
#include <utility>

#include "hpc_train/error.h"

namespace hpc_train {

namespace {

size_t checked_threads(int reads_in_flight) {
  if (reads_in_flight < kMinReaderThreads || reads_in_flight > kMaxReaderThreads)
    throw Error("reader threads = " + std::to_string(reads_in_flight) + ", expected " +
                std::to_string(kMinReaderThreads) + " to " + std::to_string(kMaxReaderThreads));
  return static_cast<size_t>(reads_in_flight - 1);
}

}  // namespace

ReaderThreads::ReaderThreads(int reads_in_flight) {
  const size_t threads = checked_threads(reads_in_flight);
  threads_.reserve(threads);
  for (size_t t = 0; t < threads; ++t) threads_.emplace_back(&ReaderThreads::serve, this);
}

ReaderThreads::~ReaderThreads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

void ReaderThreads::run(size_t count, const std::function<void(size_t)>& read) {
  if (threads_.empty() || count <= 1) {  // nothing to overlap: in order, on this thread
    for (size_t i = 0; i < count; ++i) read(i);
    return;
  }
  std::lock_guard<std::mutex> turn(turn_);
  std::unique_lock<std::mutex> lock(mutex_);
  read_ = &read;
  count_ = count;
  next_ = 0;
  unfinished_ = count;
  error_index_ = std::numeric_limits<size_t>::max();
  error_ = nullptr;
  work_.notify_all();
  take_reads(lock);
  // Once unfinished_ is 0 no thread touches `read` again: next_ == count_ stops them.
  done_.wait(lock, [&] { return unfinished_ == 0; });
  read_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void ReaderThreads::serve() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_.wait(lock, [&] { return stop_ || (read_ && next_ < count_); });
    if (stop_) return;
    take_reads(lock);
  }
}

// Starts the batch's reads one after another until none is left; `lock` (on mutex_) is held
// between reads, not during them.
void ReaderThreads::take_reads(std::unique_lock<std::mutex>& lock) {
  while (read_ && next_ < count_) {
    const size_t index = next_++;
    const std::function<void(size_t)>& read = *read_;
    lock.unlock();
    std::exception_ptr error;
    try {
      read(index);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && index < error_index_) {
      error_index_ = index;
      error_ = error;
    }
    if (--unfinished_ == 0) done_.notify_all();
  }
}

}  // namespace hpc_train

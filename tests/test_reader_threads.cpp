// ReaderThreads (Note [Reads in flight]): every read of a batch runs once, batches after a failed
// one still run, the exception rethrown is the lowest index's whatever the order they ran in,
// concurrent callers take turns, and a count out of range is refused.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "hpc_train/error.h"
#include "hpc_train/io/reader_threads.h"

using namespace hpc_train;

TEST(ReaderThreads, EveryReadRunsOnce) {
  for (int reads_in_flight : {1, 2, 8}) {
    ReaderThreads readers(reads_in_flight);
    EXPECT_EQ(readers.reads_in_flight(), reads_in_flight);
    for (size_t count : {0, 1, 3, 100}) {
      std::vector<std::atomic<int>> runs(count);
      readers.run(count, [&](size_t i) { ++runs[i]; });
      for (size_t i = 0; i < count; ++i) EXPECT_EQ(runs[i].load(), 1) << "read " << i;
    }
  }
}

TEST(ReaderThreads, RethrowsTheLowestIndexsError) {
  for (int reads_in_flight : {1, 4}) {
    ReaderThreads readers(reads_in_flight);
    for (int batch = 0; batch < 20; ++batch) {
      try {
        // Index 3 fails last: the others fail at once, 3 after the later ones have thrown.
        readers.run(12, [](size_t i) {
          if (i == 3) std::this_thread::sleep_for(std::chrono::milliseconds(2));
          if (i >= 3 && i % 3 == 0) throw DataError("read " + std::to_string(i));
        });
        ADD_FAILURE() << "no error";
      } catch (const DataError& e) {
        EXPECT_STREQ(e.what(), "read 3");
      }
    }
    std::atomic<size_t> sum{0};  // the pool still serves after errors
    readers.run(10, [&](size_t i) { sum += i; });
    EXPECT_EQ(sum, 45u);
  }
}

TEST(ReaderThreads, ConcurrentCallersTakeTurns) {
  ReaderThreads readers(3);
  std::vector<std::atomic<int>> runs(4 * 50);
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&, c] {
      for (int batch = 0; batch < 10; ++batch)
        readers.run(50, [&](size_t i) { ++runs[static_cast<size_t>(c) * 50 + i]; });
    });
  for (std::thread& caller : callers) caller.join();
  for (const std::atomic<int>& run : runs) EXPECT_EQ(run.load(), 10);
}

TEST(ReaderThreads, RefusesACountOutOfRange) {
  EXPECT_THROW(ReaderThreads{kMinReaderThreads - 1}, Error);
  EXPECT_THROW(ReaderThreads{kMaxReaderThreads + 1}, Error);
  EXPECT_NO_THROW(ReaderThreads{kMaxReaderThreads});
}

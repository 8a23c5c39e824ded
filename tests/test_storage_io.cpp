// The /proc/<pid>/io counters (storage_io.h): parsing, unknown against zero, differences, and
// the JSON of per-rank figures.
#include <gtest/gtest.h>

#include "hpc_train/monitor/storage_io.h"

namespace hpc_train {
namespace {

// What Linux 6.1 writes for a process.
constexpr const char* kProcIo =
    "rchar: 123456789\n"
    "wchar: 4096\n"
    "syscr: 120\n"
    "syscw: 3\n"
    "read_bytes: 98304\n"
    "write_bytes: 8192\n"
    "cancelled_write_bytes: 0\n";

TEST(StorageIo, ParsesReadBytesAndRchar) {
  const std::optional<StorageReadBytes> reads = parse_proc_io(kProcIo);
  ASSERT_TRUE(reads);
  EXPECT_EQ(reads->storage_read_bytes, 98304);
  EXPECT_EQ(reads->syscall_read_bytes, 123456789);
}

TEST(StorageIo, MissingOrMalformedCountersAreUnknown) {
  EXPECT_FALSE(parse_proc_io(""));
  EXPECT_FALSE(parse_proc_io("rchar: 5\nwchar: 1\n"));          // no read_bytes
  EXPECT_FALSE(parse_proc_io("rchar: 5\nread_bytes: -1\n"));    // negative
  EXPECT_FALSE(parse_proc_io("rchar: x5\nread_bytes: 1\n"));    // not a number
  EXPECT_FALSE(parse_proc_io("rchar: 5kB\nread_bytes: 1\n"));   // trailing text
  EXPECT_FALSE(parse_proc_io("rchar: 99999999999999999999\nread_bytes: 1\n"));  // overflow
}

TEST(StorageIo, ThisProcessHasReadSomething) {
  // Linux with task I/O accounting (every kernel the project runs on); reading /proc/self/io
  // itself goes through read(), so rchar is above 0.
  const std::optional<StorageReadBytes> reads = process_storage_reads();
  ASSERT_TRUE(reads) << "/proc/self/io is not readable here";
  EXPECT_GT(reads->syscall_read_bytes, 0);
  EXPECT_GE(reads->storage_read_bytes, 0);
}

TEST(StorageIo, DifferencesAreUnknownWhenEitherEndIs) {
  const StorageReadBytes before{100, 1000}, after{400, 5000};
  const std::optional<StorageReadBytes> between = storage_reads_between(before, after);
  ASSERT_TRUE(between);
  EXPECT_EQ(between->storage_read_bytes, 300);
  EXPECT_EQ(between->syscall_read_bytes, 4000);
  EXPECT_FALSE(storage_reads_between(std::nullopt, after));
  EXPECT_FALSE(storage_reads_between(before, std::nullopt));
}

TEST(StorageIo, UnknownRanksAreNullInTheJson) {
  const StorageReadsByRank by_rank{{4096, -1}, {8192, -1}};
  const nlohmann::json json = by_rank.to_json();
  EXPECT_EQ(json["storage_read_bytes_per_rank"], nlohmann::json::parse("[4096, null]"));
  EXPECT_EQ(json["syscall_read_bytes_per_rank"], nlohmann::json::parse("[8192, null]"));
}

}  // namespace
}  // namespace hpc_train

// What this process has read, as the kernel counts it in /proc/self/io: the bytes fetched from
// the storage layer (read_bytes; page-cache hits cost none, readahead and whole pages count)
// and the bytes that went through read system calls (rchar: any file, pipe or socket, cached or
// not). The trainer takes them at epoch boundaries (Note [Storage reads per epoch] in
// run_report.cpp); bench/data_bench.sh compares them with the bytes the samples hold.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hpc_train {

struct StorageReadBytes {
  int64_t storage_read_bytes = 0;  // read_bytes
  int64_t syscall_read_bytes = 0;  // rchar
};

// The two counters from the text of /proc/<pid>/io; nullopt when either is missing or not a
// non-negative integer.
std::optional<StorageReadBytes> parse_proc_io(const std::string& text);

// This process's counters; nullopt where /proc/self/io cannot be read (not Linux, a kernel
// without task I/O accounting, a restricted /proc): unknown, not zero.
std::optional<StorageReadBytes> process_storage_reads();

// `after` - `before`; nullopt when either is unknown.
std::optional<StorageReadBytes> storage_reads_between(const std::optional<StorageReadBytes>& before,
                                                      const std::optional<StorageReadBytes>& after);

// Every rank's reads over a span (an epoch, the run), in rank order, as rank 0 gathers them; -1
// for a rank whose counters are unknown.
struct StorageReadsByRank {
  std::vector<int64_t> storage_read_bytes;
  std::vector<int64_t> syscall_read_bytes;

  // {"storage_read_bytes_per_rank": [...], "syscall_read_bytes_per_rank": [...]}, an unknown
  // rank's value null.
  nlohmann::json to_json() const;
};

}  // namespace hpc_train

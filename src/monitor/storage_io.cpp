#include "hpc_train/monitor/storage_io.h"

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace hpc_train {

std::optional<StorageReadBytes> parse_proc_io(const std::string& text) {
  // Lines "name: value", e.g. "rchar: 1234"; other names (wchar, syscr, ...) are skipped.
  std::optional<int64_t> read_bytes, rchar;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string name = line.substr(0, colon);
    if (name != "read_bytes" && name != "rchar") continue;
    const std::string value = line.substr(colon + 1);
    const size_t digits = value.find_first_not_of(' ');
    if (digits == std::string::npos || value[digits] < '0' || value[digits] > '9')
      return std::nullopt;
    char* end = nullptr;
    errno = 0;
    const long long number = std::strtoll(value.c_str() + digits, &end, 10);
    if (errno != 0 || (*end != '\0' && *end != ' ')) return std::nullopt;
    (name == "rchar" ? rchar : read_bytes) = number;
  }
  if (!read_bytes || !rchar) return std::nullopt;
  return StorageReadBytes{*read_bytes, *rchar};
}

std::optional<StorageReadBytes> process_storage_reads() {
  std::ifstream in("/proc/self/io");
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return parse_proc_io(text.str());
}

std::optional<StorageReadBytes> storage_reads_between(
    const std::optional<StorageReadBytes>& before, const std::optional<StorageReadBytes>& after) {
  if (!before || !after) return std::nullopt;
  return StorageReadBytes{after->storage_read_bytes - before->storage_read_bytes,
                          after->syscall_read_bytes - before->syscall_read_bytes};
}

nlohmann::json StorageReadsByRank::to_json() const {
  auto per_rank = [](const std::vector<int64_t>& values) {
    nlohmann::json list = nlohmann::json::array();
    for (int64_t value : values)
      list.push_back(value < 0 ? nlohmann::json() : nlohmann::json(value));
    return list;
  };
  return {{"storage_read_bytes_per_rank", per_rank(storage_read_bytes)},
          {"syscall_read_bytes_per_rank", per_rank(syscall_read_bytes)}};
}

}  // namespace hpc_train

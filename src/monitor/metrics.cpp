#include "hpc_train/monitor/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace hpc_train {

MonitorFile::MonitorFile(const std::string& path, const std::string& monitor)
    : path_(path), monitor_(monitor) {
  fd_ = FileDescriptor(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666));
  if (fd_.get() < 0) {
    fail("open", errno);
    return;
  }
  struct stat status {};
  if (::fstat(fd_.get(), &status) == 0) opened_size_bytes_ = status.st_size;
}

bool MonitorFile::append(std::string_view record) {
  if (failed_ || fd_.get() < 0) return false;
  // Where this record starts, to cut a part of it off again (O_APPEND writes at the end).
  struct stat status {};
  const off_t start = ::fstat(fd_.get(), &status) == 0 ? status.st_size : -1;
  const char* cursor = record.data();
  size_t left = record.size();
  while (left > 0) {
    const ssize_t written = ::write(fd_.get(), cursor, left);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      // A full disk often takes part of a record first (a short write), then refuses the rest.
      const int error_number = written < 0 ? errno : ENOSPC;
      if (start >= 0 && left < record.size()) (void)::ftruncate(fd_.get(), start);
      fail("write", error_number);
      return false;
    }
    cursor += written;
    left -= static_cast<size_t>(written);
  }
  return true;
}

void MonitorFile::fail(const char* what, int error_number) {
  failed_ = true;
  fd_ = FileDescriptor();
  std::fprintf(stderr, "warning: cannot %s %s: %s; %s writes nothing more, training goes on\n",
               what, path_.c_str(), std::strerror(error_number), monitor_.c_str());
  std::fflush(stderr);
}

JsonlWriter::JsonlWriter(const std::string& path) : file_(path, "metrics.jsonl") {}

void JsonlWriter::write(const nlohmann::json& record) {
  if (path().empty()) return;
  file_.append(record.dump() + '\n');
}

}  // namespace hpc_train

// Note [Atomic file write] (atomic_file.h).
#include "hpc_train/io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "hpc_train/error.h"

namespace hpc_train {
namespace {

std::string system_error() { return std::strerror(errno); }

void sync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open " + path + " to sync it: " + system_error());
  const int rc = ::fsync(fd);
  const std::string error = rc != 0 ? system_error() : "";
  ::close(fd);
  if (rc != 0) throw Error("cannot sync " + path + ": " + error);
}

void sync_directory(const std::string& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort (the Note)
  (void)::fsync(fd);
  ::close(fd);
}

}  // namespace

std::string directory_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

AtomicFile::AtomicFile(std::string path)
    : AtomicFile(std::move(path), ".tmp." + std::to_string(::getpid())) {}

AtomicFile::AtomicFile(std::string path, std::string temporary_suffix)
    : path_(std::move(path)), temporary_(path_ + temporary_suffix) {}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temporary_.c_str());
}

void AtomicFile::append(const void* bytes, size_t size) {
  if (fd_ < 0) {
    fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd_ < 0)
      throw Error("cannot create " + temporary_ + " (to write " + path_ + "): " + system_error());
  }
  const auto* cursor = static_cast<const char*>(bytes);
  while (size > 0) {
    const ssize_t written = ::write(fd_, cursor, size);
    if (written < 0 && errno == EINTR) continue;
    if (written < 0) throw Error("cannot write " + temporary_ + ": " + system_error());
    cursor += written;
    size -= static_cast<size_t>(written);
  }
}

void AtomicFile::commit() {
  if (fd_ >= 0) {
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) throw Error("cannot close " + temporary_ + ": " + system_error());
  }
  sync_file(temporary_);
  if (::rename(temporary_.c_str(), path_.c_str()) != 0)
    throw Error("cannot rename " + temporary_ + " to " + path_ + ": " + system_error());
  committed_ = true;
  sync_directory(directory_of(path_));
}

void write_file_atomically(const std::string& path, const void* bytes, size_t size) {
  AtomicFile file(path);
  file.append(bytes, size);
  file.commit();
}

void write_file_atomically(const std::string& path, const std::string& text) {
  write_file_atomically(path, text.data(), text.size());
}

}  // namespace hpc_train

// Files that a reader must never see half-written: checkpoints, weights exports, converted
// datasets, a run's config.ini and summary.json.
//
// Note [Atomic file write]: the file is written under a temporary name in its own directory,
// synced (fsync), renamed over its final name, and then the directory is synced, so that a crash
// at any moment leaves either the old file or the whole new one under the name, and at most a
// temporary file beside it. The directory sync is best effort: some file systems (several
// network ones) refuse fsync on a directory, and the file is complete either way; a crash can
// then only lose the rename, leaving the old file. POSIX calls, not std::filesystem: fsync has
// no std::filesystem equivalent, and with the PyTorch wheel's LibTorch linked in,
// std::filesystem::remove_all crashed on the GPU machine.
#pragma once

#include <cstddef>
#include <string>

namespace hpc_train {

// The directory part of `path` ("." for a bare name).
std::string directory_of(const std::string& path);

// One atomic write of `path`: the caller writes temporary() by any means (HDF5, MPI-IO from
// several ranks), or appends bytes through append(), then calls commit(). Destroyed uncommitted (an error unwound), it removes
// the temporary file. Non-copyable; the destructor never throws.
class AtomicFile {
 public:
  // The temporary file is `path` + `temporary_suffix`; the default adds the process id, so that
  // two writers (two jobs sharing a directory) stay off each other's temporary file.
  explicit AtomicFile(std::string path);
  AtomicFile(std::string path, std::string temporary_suffix);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  const std::string& path() const { return path_; }
  const std::string& temporary() const { return temporary_; }
  // Writes `size` bytes at the end of the temporary file (created by the first call).
  void append(const void* bytes, size_t size);
  // Syncs the complete temporary file, renames it to path(), syncs the directory. Throws Error
  // naming the files.
  void commit();

 private:
  std::string path_;
  std::string temporary_;
  int fd_ = -1;  // open while append() writes
  bool committed_ = false;
};

// The whole of `bytes` (or `text`) as `path`, atomically. Throws Error naming the file.
void write_file_atomically(const std::string& path, const void* bytes, size_t size);
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace hpc_train

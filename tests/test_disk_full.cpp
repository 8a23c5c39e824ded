// A disk that fills up while a file is written, without a disk to fill (test_disk_full_run.sh
// fills small tmpfs mounts under the real program):
//   - a monitor's file (Note [Monitors never end the run] in metrics.h), ended part way by
//     RLIMIT_FSIZE (a short write, then EFBIG, as a full disk gives a short write, then ENOSPC):
//     one warning naming the file and the OS error, its whole records kept, nothing written after;
//   - a checkpoint write whose file fills up under HDF5 itself, past the free-space check and the
//     reservation (Note [Checkpoint space] in checkpoint.h, step 3): an Error naming the file and
//     the OS error, no temporary file, the earlier checkpoint as it was, and HDF5 still able to
//     write and read the next checkpoint and to shut down at MPI_Finalize. HDF5 1.10 used to
//     crash there (signal 11 when this test ended).
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "example_checkpoints.h"
#include "expect_error.h"
#include "hpc_train/error.h"
#include "hpc_train/io/checkpoint.h"
#include "hpc_train/monitor/metrics.h"

using namespace hpc_train;
namespace fs = std::filesystem;

namespace {

// The disk of checkpoint temporaries (*.h5.tmp) fills up once a write to one reaches past
// g_full_at_bytes (-1: never): that write and every later write to such a file fail with
// ENOSPC, wherever in the file, as on a full disk whose file has holes (HDF5 leaves its metadata's
// places unwritten until the flush). Writes to other files pass.
std::atomic<int64_t> g_full_at_bytes{-1};
std::atomic<bool> g_full{false};

bool is_checkpoint_temporary(int fd) {
  char target[4096] = {};
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t length = readlink(link.c_str(), target, sizeof target - 1);
  const std::string suffix = ".h5.tmp";
  return length > static_cast<ssize_t>(suffix.size()) &&
         std::string(target, length).compare(length - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

// HDF5's POSIX driver writes with pwrite: this definition, in the executable, is the one its
// calls reach.
extern "C" ssize_t pwrite(int fd, const void* bytes, size_t count, off_t offset) {
  const int64_t full_at_bytes = g_full_at_bytes.load();
  if (full_at_bytes >= 0 && is_checkpoint_temporary(fd) &&
      (g_full.load() || offset + static_cast<int64_t>(count) > full_at_bytes)) {
    g_full = true;
    errno = ENOSPC;
    return -1;
  }
  return syscall(SYS_pwrite64, fd, bytes, count, offset);
}

namespace {

using hpc_train::test_support::realistic_checkpoint;
using ::test_support::read_bytes;

// Files of this process end at `limit_bytes` while it lives (RLIMIT_FSIZE, SIGXFSZ ignored).
class FileSizeLimit {
 public:
  explicit FileSizeLimit(uint64_t limit_bytes) {
    getrlimit(RLIMIT_FSIZE, &saved_);
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit limit = saved_;
    limit.rlim_cur = limit_bytes;
    EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0) << std::strerror(errno);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit saved_{};
  void (*old_handler_)(int) = SIG_DFL;
};

class DiskFullTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "hpc_train_disk_full_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    g_full_at_bytes = -1;
    g_full = false;
    fs::remove_all(dir_);
  }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  std::string dir_;
};

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST_F(DiskFullTest, AMonitorFileWarnsOnceKeepsWholeRecordsAndStops) {
  const std::string file = path("metrics.jsonl");
  // Longer than the warning: stderr, captured into a file, ends at the limit too.
  const std::string record = "{\"kind\":\"train\",\"loss\":\"" + std::string(300, 'x') + "\"}\n";
  MonitorFile monitor(file, "metrics.jsonl");
  testing::internal::CaptureStderr();
  std::vector<bool> written;
  {
    // Room for three records and a part of the fourth: a short write, then EFBIG.
    const FileSizeLimit limit(3 * record.size() + 100);
    for (int i = 0; i < 6; ++i) written.push_back(monitor.append(record));
  }
  const std::string warnings = testing::internal::GetCapturedStderr();
  EXPECT_EQ(written, (std::vector<bool>{true, true, true, false, false, false}));
  EXPECT_TRUE(monitor.failed());
  EXPECT_EQ(count(warnings, "warning:"), 1u) << warnings;
  EXPECT_NE(warnings.find("warning: cannot write " + file + ": " + std::strerror(EFBIG) +
                          "; metrics.jsonl writes nothing more, training goes on"),
            std::string::npos)
      << warnings;
  // The part of the fourth record was cut off again, and nothing is written after the failure,
  // now that there would be room.
  EXPECT_FALSE(monitor.append(record));
  const std::vector<uint8_t> bytes = read_bytes(file);
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), record + record + record);
}

TEST_F(DiskFullTest, AMonitorFileThatCannotBeOpenedWarnsOnce) {
  const std::string file = path("missing-folder/events");
  testing::internal::CaptureStderr();
  MonitorFile monitor(file, "the TensorBoard monitor");
  EXPECT_FALSE(monitor.append("x"));
  EXPECT_FALSE(monitor.append("y"));
  const std::string warnings = testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(warnings, "warning:"), 1u) << warnings;
  EXPECT_NE(warnings.find("warning: cannot open " + file + ": " + std::strerror(ENOENT) +
                          "; the TensorBoard monitor writes nothing more"),
            std::string::npos)
      << warnings;
}

// Where a dataset's data ends in the file at `path` (HDF5's own calls).
uint64_t data_end(const std::string& path, const char* dataset_name) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t dataset = H5Dopen2(file, dataset_name, H5P_DEFAULT);
  const uint64_t end = H5Dget_offset(dataset) + H5Dget_storage_size(dataset);
  H5Dclose(dataset);
  H5Fclose(file);
  return end;
}

// The disk fills up right after the master weights' data (the write of exp_avg fails; the close
// would write exp_avg's object header, placed after master's data) or half way through
// exp_avg_sq's data.
TEST_F(DiskFullTest, HdfFailingPartWayIsAnErrorAndLeavesHdf5Usable) {
  const Checkpoint first = realistic_checkpoint(1);
  const std::string earlier = path("step-00000001.h5");
  write_checkpoint_file(earlier, first);
  const std::vector<uint8_t> earlier_bytes = read_bytes(earlier);
  // Checkpoints of the same shapes have the same layout.
  const uint64_t master_end = data_end(earlier, "/optimizer/master");
  const uint64_t exp_avg_sq_end = data_end(earlier, "/optimizer/exp_avg_sq");
  const uint64_t exp_avg_sq_bytes = first.exp_avg_sq.size() * sizeof(float);
  ASSERT_GT(master_end, 0u);
  ASSERT_GT(exp_avg_sq_end, master_end + exp_avg_sq_bytes);

  const Checkpoint second = realistic_checkpoint(2);
  const std::string failing = path("step-00000002.h5");
  for (const uint64_t full_at_bytes : {master_end, exp_avg_sq_end - exp_avg_sq_bytes / 2}) {
    SCOPED_TRACE("disk full at byte " + std::to_string(full_at_bytes));
    g_full_at_bytes = static_cast<int64_t>(full_at_bytes);
    g_full = false;
    ::test_support::expect_error<Error>(
        [&] { write_checkpoint_file(failing, second); },
        {"cannot write checkpoint " + failing, failing + ".tmp", std::strerror(ENOSPC)});
    EXPECT_TRUE(g_full.load()) << "the disk never filled up";
    g_full_at_bytes = -1;
    EXPECT_EQ(listing(), std::vector<std::string>{"step-00000001.h5"});
    EXPECT_EQ(read_bytes(earlier), earlier_bytes);
  }
  write_checkpoint_file(failing, second);
  const Checkpoint read_back = read_checkpoint(failing);
  // Bytes: the arrays hold NaNs.
  EXPECT_EQ(0, std::memcmp(read_back.exp_avg_sq.data(), second.exp_avg_sq.data(),
                           exp_avg_sq_bytes));
  EXPECT_EQ(read_checkpoint(earlier).position.global_step, first.position.global_step);
  // What was reserved past the file's end went back.
  struct stat status {};
  ASSERT_EQ(::stat(failing.c_str(), &status), 0);
  EXPECT_LE(static_cast<uint64_t>(status.st_blocks) * 512, status.st_size + 64 * 1024);
}

}  // namespace

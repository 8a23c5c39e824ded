// Metrics: wall-clock timing and the JSON-lines log of a run (one object per log interval and
// per epoch, written by rank 0 to <run dir>/metrics.jsonl).
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "hpc_train/io/file_descriptor.h"

namespace hpc_train {

// Milliseconds since construction or the last restart(); steady clock.
class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  void restart() { start_ = Clock::now(); }
  double elapsed_ms() const {
    return std::chrono::duration<double, std::milli>(Clock::now() - start_).count();
  }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_;
};

// One monitor event, as DeepSpeed's monitors take it (a (tag, value, step) tuple): the
// TensorBoard and CSV writers (tensorboard_events.h, csv_monitor.h) write these.
struct ScalarEvent {
  std::string tag;  // e.g. "Train/Samples/train_loss"
  double value = 0.0;
  int64_t step = 0;  // DeepSpeed's x axis: samples seen (global_samples)
};

// Note [Monitors never end the run]
// metrics.jsonl, the TensorBoard event files and the CSV monitor's files are for watching a
// run, not its result: a monitor that cannot write (a full disk, a quota) must not cost the
// training. Their folders are made before training starts, where a wrong path still stops the
// job (create_output_directory in run_dir.h). From then on every monitor's file goes through a
// MonitorFile: the first open or write that fails prints ONE warning on stderr, naming the file,
// the OS error and the monitor, and that monitor writes nothing more; the others, and the
// training, go on, and the run ends as it would have (exit 0). A record that only partly went
// in is cut off again, so the file ends with its last whole record (a JSON line, a TFRecord, a
// CSV row), which every reader takes. Checkpoints and summary.json are the run's result, not
// monitors: a failure to write one ends the job naming the file (Note [Checkpoint space] in
// checkpoint.h).

// An append-only file of one monitor, written in whole records, each at once (unbuffered: a
// killed run keeps what it logged, a live TensorBoard sees each interval). Note [Monitors never
// end the run]: it never throws; once an open or a write failed it warns once and drops
// everything after. Rank 0's monitors only: no locking.
class MonitorFile {
 public:
  MonitorFile() = default;  // drops everything, silently
  // Opens `path` for appending (created when missing). `monitor` names what stops in the
  // warning: "metrics.jsonl", "the TensorBoard monitor", ...
  MonitorFile(const std::string& path, const std::string& monitor);

  // Appends `record` whole; false when it is not in the file (this failure warned, or an
  // earlier one did).
  bool append(std::string_view record);
  bool failed() const { return failed_; }
  // Bytes in the file when it was opened; 0 for a file that failed to open.
  int64_t opened_size_bytes() const { return opened_size_bytes_; }
  const std::string& path() const { return path_; }

 private:
  void fail(const char* what, int error_number);

  std::string path_;
  std::string monitor_;
  FileDescriptor fd_;
  int64_t opened_size_bytes_ = 0;
  bool failed_ = false;
};

// Appends one JSON object per line, each written at once so that a killed run keeps what it
// logged. A default-constructed writer (other ranks, tests) drops everything; a file that cannot
// be written warns once and drops the rest (Note [Monitors never end the run]).
class JsonlWriter {
 public:
  JsonlWriter() = default;
  explicit JsonlWriter(const std::string& path);
  void write(const nlohmann::json& record);
  const std::string& path() const { return file_.path(); }  // empty for a writer that drops

 private:
  MonitorFile file_;
};

}  // namespace hpc_train

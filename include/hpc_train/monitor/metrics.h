// Metrics: wall-clock timing and the JSON-lines log of a run (one object per log interval and
// per epoch, written by rank 0 to <run dir>/metrics.jsonl).
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>

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

// Appends one JSON object per line, flushed at once so that a killed run keeps what it logged.
// A default-constructed writer (other ranks, tests) drops everything.
class JsonlWriter {
 public:
  JsonlWriter() = default;
  explicit JsonlWriter(const std::string& path);
  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }  // empty for a writer that drops

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace hpc_train

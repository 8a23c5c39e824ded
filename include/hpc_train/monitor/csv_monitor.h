// DeepSpeed's csv_monitor layout (deepspeed/monitor/csv_monitor.py): one CSV file per tag in
// <output_path>/<job_name>/, named after the tag with '/' and ' ' replaced by '_'
// (Train/Samples/train_loss -> Train_Samples_train_loss.csv), with the header "step,<the tag's
// last '/' part>" and one "step,value" row per event. Rows end in "\r\n", as Python's csv
// writer ends them. Unlike DeepSpeed, a file that already has rows (a resumed run) gets no
// second header.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "hpc_train/monitor/metrics.h"

namespace hpc_train {

// The file name DeepSpeed gives a tag's CSV ("Train/Samples/lr" -> "Train_Samples_lr.csv").
std::string csv_monitor_file_name(const std::string& tag);

// Appends events to the tags' CSV files in `directory` (created with its parents). A
// default-constructed writer drops everything; so does one after a file of it could not be
// written, which warned once (Note [Monitors never end the run] in metrics.h).
class CsvMonitorWriter {
 public:
  CsvMonitorWriter() = default;
  // Throws Error naming the directory when it cannot be created.
  explicit CsvMonitorWriter(const std::string& directory);
  // Each event appended to its tag's file, written at once.
  void write(const std::vector<ScalarEvent>& events);
  const std::string& directory() const { return directory_; }

 private:
  std::string directory_;
  bool failed_ = false;
};

}  // namespace hpc_train

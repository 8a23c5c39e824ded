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
// default-constructed writer drops everything.
class CsvMonitorWriter {
 public:
  CsvMonitorWriter() = default;
  // Throws Error naming the directory when it cannot be created.
  explicit CsvMonitorWriter(const std::string& directory);
  // Each event appended to its tag's file, flushed. Throws Error naming a file it cannot write.
  void write(const std::vector<ScalarEvent>& events);
  const std::string& directory() const { return directory_; }

 private:
  std::string directory_;
};

}  // namespace hpc_train

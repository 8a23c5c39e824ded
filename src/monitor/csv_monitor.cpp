#include "hpc_train/monitor/csv_monitor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "hpc_train/error.h"

namespace hpc_train {
namespace {

// As Python's str(float) prints a value in DeepSpeed's files: the shortest of %.15g and %.17g
// that reads back to the same double (0.001 stays 0.001), and a whole number with ".0" (2.0).
std::string format_number(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.15g", value);
  if (std::strtod(text, nullptr) != value) std::snprintf(text, sizeof text, "%.17g", value);
  std::string shown = text;
  if (std::isfinite(value) && shown.find_first_of(".e") == std::string::npos) shown += ".0";
  return shown;
}

}  // namespace

std::string csv_monitor_file_name(const std::string& tag) {
  std::string name = tag;
  std::replace(name.begin(), name.end(), '/', '_');
  std::replace(name.begin(), name.end(), ' ', '_');
  return name + ".csv";
}

CsvMonitorWriter::CsvMonitorWriter(const std::string& directory) : directory_(directory) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error || !std::filesystem::is_directory(directory)) {
    throw Error("CSV monitor directory " + directory + ": cannot create it" +
                (error ? " (" + error.message() + ")" : ""));
  }
}

void CsvMonitorWriter::write(const std::vector<ScalarEvent>& events) {
  if (directory_.empty() || failed_) return;
  for (const ScalarEvent& event : events) {
    MonitorFile file(directory_ + "/" + csv_monitor_file_name(event.tag), "the CSV monitor");
    std::string rows;
    if (file.opened_size_bytes() == 0) {
      const size_t slash = event.tag.rfind('/');
      rows = "step," + (slash == std::string::npos ? event.tag : event.tag.substr(slash + 1)) +
             "\r\n";
    }
    rows += std::to_string(event.step) + ',' + format_number(event.value) + "\r\n";
    // Note [Monitors never end the run]: the first file that fails stops the whole monitor,
    // after its one warning.
    if (!file.append(rows)) {
      failed_ = true;
      return;
    }
  }
}

}  // namespace hpc_train

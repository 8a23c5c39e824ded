#include "hpc_train/monitor/csv_monitor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

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
  if (directory_.empty()) return;
  for (const ScalarEvent& event : events) {
    const std::string path = directory_ + "/" + csv_monitor_file_name(event.tag);
    std::error_code missing;
    const uintmax_t size_bytes = std::filesystem::file_size(path, missing);
    const bool has_rows = !missing && size_bytes > 0;
    std::ofstream out(path, std::ios::binary | std::ios::app);
    if (!out) throw Error("cannot open " + path + " for writing");
    if (!has_rows) {
      const size_t slash = event.tag.rfind('/');
      out << "step," << (slash == std::string::npos ? event.tag : event.tag.substr(slash + 1))
          << "\r\n";
    }
    out << event.step << ',' << format_number(event.value) << "\r\n";
    out.flush();
    if (!out) throw Error("cannot write to " + path);
  }
}

}  // namespace hpc_train

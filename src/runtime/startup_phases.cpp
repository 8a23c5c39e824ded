#include "hpc_train/runtime/startup_phases.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace hpc_train {

double seconds_since_process_start() {
  // /proc/self/stat: "pid (comm) state ppid ..."; comm may hold spaces and parentheses, so the
  // fields are counted from the last ')'. Field 22 is the start time in clock ticks since boot.
  std::ifstream stat_file("/proc/self/stat");
  std::ifstream uptime_file("/proc/uptime");
  std::string stat;
  double uptime_s = 0.0;
  if (!std::getline(stat_file, stat) || !(uptime_file >> uptime_s)) return -1.0;
  const size_t comm_end = stat.rfind(')');
  if (comm_end == std::string::npos) return -1.0;
  std::istringstream fields(stat.substr(comm_end + 1));
  std::string field;
  for (int number = 3; number < 22; ++number) fields >> field;  // state (3) .. itrealvalue (21)
  unsigned long long start_ticks = 0;
  const long ticks_per_s = sysconf(_SC_CLK_TCK);
  if (!(fields >> start_ticks) || ticks_per_s <= 0) return -1.0;
  return uptime_s - static_cast<double>(start_ticks) / static_cast<double>(ticks_per_s);
}

StartupPhases::StartupPhases() {
  const double loading_s = seconds_since_process_start();
  if (loading_s >= 0.0) phases_s_.emplace_back("loading", loading_s);
}

void StartupPhases::end_phase(const std::string& name) {
  const double now_s = since_main_.elapsed_ms() / 1e3;
  phases_s_.emplace_back(name, now_s - last_mark_s_);
  last_mark_s_ = now_s;
}

std::string StartupPhases::describe() const {
  double total_s = 0.0;
  std::string parts;
  for (const auto& [name, seconds] : phases_s_) {
    char part[64];
    std::snprintf(part, sizeof part, "%s%s %.2f s", parts.empty() ? "" : ", ", name.c_str(),
                  seconds);
    parts += part;
    total_s += seconds;
  }
  char head[48];
  std::snprintf(head, sizeof head, "Start-up %.2f s: ", total_s);
  return head + parts;
}

nlohmann::json StartupPhases::to_json() const {
  nlohmann::json record = nlohmann::json::object();
  double total_s = 0.0;
  for (const auto& [name, seconds] : phases_s_) {
    record[name + "_s"] = seconds;
    total_s += seconds;
  }
  record["total_s"] = total_s;
  return record;
}

}  // namespace hpc_train

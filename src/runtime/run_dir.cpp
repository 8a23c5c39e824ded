#include "hpc_train/runtime/run_dir.h"

#include <ctime>
#include <filesystem>

#include "hpc_train/error.h"
#include "hpc_train/runtime/runtime.h"

namespace hpc_train {

std::string default_run_dir() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &utc);
  return std::string("runs/") + stamp;
}

namespace {

void create_directory_or_refuse(const std::string& path, const std::string& options,
                                const char* what) {
  std::error_code error;
  std::filesystem::create_directories(path, error);
  if (error || !std::filesystem::is_directory(path))
    throw ConfigError(options + " " + path + ": cannot create " + what + " (" +
                      (error ? error.message() : "a file of that name exists") + ")");
}

}  // namespace

std::string create_run_directory(const Runtime& runtime, const std::string& requested) {
  std::string path;
  run_agreed_phase(runtime, [&] {
    if (runtime.rank() != 0) return;
    path = requested.empty() ? default_run_dir() : requested;
    create_directory_or_refuse(path, "--run-dir", "the run directory");
  });
  return broadcast_string(runtime.world(), path, 0);
}

void create_output_directory(const Runtime& runtime, const std::string& path,
                             const std::string& options) {
  run_agreed_phase(runtime, [&] {
    if (runtime.rank() == 0) create_directory_or_refuse(path, options, "the folder");
  });
}

}  // namespace hpc_train

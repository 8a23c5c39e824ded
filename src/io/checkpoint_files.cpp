// Checkpoint files in a run directory (checkpoint_files.h): naming, listing, pruning, finding
// the newest complete one. Listing and removing use POSIX calls, as the atomic write does
// (Note [Atomic file write]).
#include "hpc_train/io/checkpoint_files.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <limits>
#include <utility>

#include "hpc_train/io/atomic_file.h"
#include "hpc_train/io/checkpoint.h"
#include "hpc_train/error.h"

namespace hpc_train {
namespace {

constexpr char kCheckpointSubdirectory[] = "/checkpoints";
constexpr char kNamePrefix[] = "step-";
constexpr char kNameSuffix[] = ".h5";
constexpr int kStepDigits = 8;
constexpr char kLatestPointer[] = "latest";
constexpr char kAbandonedPrefix[] = "abandoned-after-step-";

std::string system_error() { return std::strerror(errno); }

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// step-<digits>.h5 -> the step; anything else (temporaries included) -> -1.
int64_t parse_checkpoint_name(const std::string& name) {
  const size_t prefix = std::strlen(kNamePrefix), suffix = std::strlen(kNameSuffix);
  if (name.size() <= prefix + suffix || name.compare(0, prefix, kNamePrefix) != 0 ||
      !ends_with(name, kNameSuffix))
    return -1;
  const std::string digits = name.substr(prefix, name.size() - prefix - suffix);
  if (digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::stoll(digits);
}

struct CheckpointListing {
  std::vector<std::pair<int64_t, std::string>> checkpoints;  // (step, path), oldest first
  std::vector<std::string> temporaries;                      // paths
};

// What <run_dir>/checkpoints holds; empty when the directory does not exist.
CheckpointListing list_checkpoints(const std::string& run_dir) {
  const std::string directory = checkpoint_directory(run_dir);
  CheckpointListing listing;
  DIR* stream = ::opendir(directory.c_str());
  if (!stream) {
    if (errno == ENOENT) return listing;
    throw Error("cannot list " + directory + ": " + system_error());
  }
  for (errno = 0; const dirent* entry = ::readdir(stream); errno = 0) {
    const std::string name = entry->d_name;
    const std::string path = directory + "/" + name;
    if (const int64_t step = parse_checkpoint_name(name); step >= 0)
      listing.checkpoints.emplace_back(step, path);
    else if (ends_with(name, kCheckpointTemporarySuffix) &&
             parse_checkpoint_name(name.substr(0, name.size() - std::strlen(kCheckpointTemporarySuffix))) >=
                 0)
      listing.temporaries.push_back(path);
  }
  const int list_errno = errno;
  ::closedir(stream);
  if (list_errno != 0) throw Error("cannot list " + directory + ": " + std::strerror(list_errno));
  std::sort(listing.checkpoints.begin(), listing.checkpoints.end());
  return listing;
}

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string latest_pointer_path(const std::string& run_dir) {
  return checkpoint_directory(run_dir) + "/" + kLatestPointer;
}

// The checkpoint `latest` names, as a path (Note [Checkpoint branches]); nullopt without one.
std::optional<std::string> read_latest_pointer(const std::string& run_dir) {
  std::ifstream in(latest_pointer_path(run_dir));
  std::string named;
  if (!in || !std::getline(in, named) || named.empty()) return std::nullopt;
  if (named.front() == '/') return named;
  return checkpoint_directory(run_dir) + "/" + named;
}

void remove_file(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    throw Error("cannot delete " + path + ": " + system_error());
}

}  // namespace

std::string checkpoint_directory(const std::string& run_dir) {
  return run_dir + kCheckpointSubdirectory;
}

std::string checkpoint_path(const std::string& run_dir, int64_t global_step) {
  if (global_step < 0) throw Error("checkpoint_path: negative step " + std::to_string(global_step));
  char name[64];
  std::snprintf(name, sizeof(name), "/%s%0*lld%s", kNamePrefix, kStepDigits,
                static_cast<long long>(global_step), kNameSuffix);
  return checkpoint_directory(run_dir) + name;
}

std::optional<std::string> find_latest_checkpoint(const std::string& run_dir,
                                                  std::vector<std::string>* warnings) {
  // Note [Checkpoint branches]: `latest` first; then by step, not above its step.
  const std::optional<std::string> latest = read_latest_pointer(run_dir);
  int64_t highest_step = std::numeric_limits<int64_t>::max();
  if (latest) {
    try {
      read_checkpoint(*latest);
      return latest;
    } catch (const Error& e) {
      if (warnings)
        warnings->push_back(latest_pointer_path(run_dir) + " names a checkpoint that does not "
                            "read back (" + e.what() + "); taking the newest before it");
    }
    const int64_t named_step = parse_checkpoint_name(base_name(*latest));
    if (named_step >= 0) highest_step = named_step;
  }
  const CheckpointListing listing = list_checkpoints(run_dir);
  for (auto it = listing.checkpoints.rbegin(); it != listing.checkpoints.rend(); ++it) {
    if (it->first > highest_step || (latest && it->second == *latest)) continue;
    try {
      read_checkpoint(it->second);
      return it->second;
    } catch (const Error& e) {
      if (warnings)
        warnings->push_back(std::string("skipped a checkpoint that does not read back: ") +
                            e.what());
    }
  }
  return std::nullopt;
}

void point_latest_checkpoint(const std::string& run_dir, const std::string& checkpoint) {
  const std::string directory = checkpoint_directory(run_dir) + "/";
  const bool inside = checkpoint.compare(0, directory.size(), directory) == 0 &&
                      checkpoint.find('/', directory.size()) == std::string::npos;
  if (::mkdir(checkpoint_directory(run_dir).c_str(), 0777) != 0 && errno != EEXIST)
    throw Error("cannot create " + checkpoint_directory(run_dir) + ": " + system_error());
  write_file_atomically(latest_pointer_path(run_dir),
                        (inside ? checkpoint.substr(directory.size()) : checkpoint) + "\n");
}

std::string set_aside_checkpoints_after(const std::string& run_dir, int64_t step) {
  const CheckpointListing listing = list_checkpoints(run_dir);
  std::vector<std::pair<int64_t, std::string>> abandoned;
  for (const auto& checkpoint : listing.checkpoints) {
    struct stat status {};
    // Files only: whatever else bears a checkpoint's name is no checkpoint to move.
    if (checkpoint.first > step && ::stat(checkpoint.second.c_str(), &status) == 0 &&
        S_ISREG(status.st_mode))
      abandoned.push_back(checkpoint);
  }
  if (abandoned.empty()) return "";
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
  std::string aside = checkpoint_directory(run_dir) + "/" + kAbandonedPrefix +
                      std::to_string(step) + "-" + stamp;
  // Two set-asides in one second (a quick restart): a suffix keeps them apart.
  for (int n = 2; ::mkdir(aside.c_str(), 0777) != 0; ++n) {
    if (errno != EEXIST || n > 99) throw Error("cannot create " + aside + ": " + system_error());
    aside = aside.substr(0, aside.rfind('Z') + 1) + "-" + std::to_string(n);
  }
  for (const auto& [abandoned_step, path] : abandoned) {
    const std::string target = aside + "/" + base_name(path);
    if (::rename(path.c_str(), target.c_str()) != 0)
      throw Error("cannot move " + path + " to " + target + ": " + system_error());
  }
  return aside;
}

void prune_checkpoints(const std::string& run_dir, int keep) {
  const CheckpointListing listing = list_checkpoints(run_dir);
  for (const std::string& temporary : listing.temporaries) remove_file(temporary);
  if (keep <= 0 || listing.checkpoints.size() <= static_cast<size_t>(keep)) return;
  for (size_t i = 0; i + keep < listing.checkpoints.size(); ++i)
    remove_file(listing.checkpoints[i].second);
}

}  // namespace hpc_train

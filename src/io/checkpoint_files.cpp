// Checkpoint files in a run directory (checkpoint_files.h): naming, listing, pruning, finding
// the newest complete one. Listing and removing use POSIX calls, as the atomic write does
// (Note [Atomic file write]).
#include "hpc_train/io/checkpoint_files.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "hpc_train/io/checkpoint.h"
#include "hpc_train/error.h"

namespace hpc_train {
namespace {

constexpr char kCheckpointSubdirectory[] = "/checkpoints";
constexpr char kNamePrefix[] = "step-";
constexpr char kNameSuffix[] = ".h5";
constexpr int kStepDigits = 8;

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
  const CheckpointListing listing = list_checkpoints(run_dir);
  for (auto it = listing.checkpoints.rbegin(); it != listing.checkpoints.rend(); ++it) {
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

void prune_checkpoints(const std::string& run_dir, int keep) {
  const CheckpointListing listing = list_checkpoints(run_dir);
  for (const std::string& temporary : listing.temporaries) remove_file(temporary);
  if (keep <= 0 || listing.checkpoints.size() <= static_cast<size_t>(keep)) return;
  for (size_t i = 0; i + keep < listing.checkpoints.size(); ++i)
    remove_file(listing.checkpoints[i].second);
}

}  // namespace hpc_train

// Checkpoint files in a run directory: their names, the newest complete one, pruning. The file
// format itself is checkpoint.h's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hpc_train {

// What write_checkpoint appends to a checkpoint's name while the file is incomplete.
inline constexpr char kCheckpointTemporarySuffix[] = ".tmp";

// <run_dir>/checkpoints and the name of the checkpoint of a step in it ("step-00001234.h5",
// zero-padded so that names sort by step up to 10^8 - 1; readers order by the number anyway).
// Throws Error for a negative step.
std::string checkpoint_directory(const std::string& run_dir);
std::string checkpoint_path(const std::string& run_dir, int64_t global_step);

// The newest checkpoint in <run_dir>/checkpoints that reads back complete (read_checkpoint
// succeeds), or nullopt when there is none (also when the directory does not exist). Temporary
// files and names that are not step-<digits>.h5 are ignored; a newer file that does not read back
// is skipped with a line appended to *warnings (naming it and why) when warnings is not null.
// Throws Error when the directory exists but cannot be listed.
std::optional<std::string> find_latest_checkpoint(const std::string& run_dir,
                                                  std::vector<std::string>* warnings = nullptr);

// Deletes all but the newest `keep` checkpoints in <run_dir>/checkpoints (keep <= 0: keeps all),
// and temporary files left by an interrupted write. Rank 0 only (not collective), and never while
// a write into that directory is in progress. Throws Error naming a file it cannot delete.
void prune_checkpoints(const std::string& run_dir, int keep);

}  // namespace hpc_train

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

// Note [Checkpoint branches]
// A run directory's checkpoints are one line of training, and `--resume auto` must follow the
// line the user chose last. Resuming by hand from step 800 in a directory that holds steps 900
// and 1000 starts a new branch; if --resume auto then went by the highest step, a preempted job
// would silently continue the abandoned 1000, and pruning (lowest steps first) would delete the
// new branch's checkpoints before the abandoned ones. So, as DeepSpeed keeps a `latest` file:
//   - <run_dir>/checkpoints/latest names the newest checkpoint of the current branch; it is
//     written atomically after each checkpoint file is complete, and when a run resumes (the
//     checkpoint it resumed from), so that a preemption before its first save comes back there;
//   - when a run starts (fresh: step 0, or resumed at step S), the checkpoints of a higher step
//     belong to an abandoned branch: they are moved, not deleted, into
//     checkpoints/abandoned-after-step-S-<UTC time>/, which neither --resume auto nor pruning
//     looks into.
// --resume auto takes the file `latest` names; where there is no `latest` (a directory of an
// older hpc_train) or its file does not read back, the newest complete checkpoint by step (not
// above the named one's step).

// The newest checkpoint of the run directory's current branch that reads back complete
// (read_checkpoint succeeds), or nullopt when there is none (also when the directory does not
// exist). Temporary files and names that are not step-<digits>.h5 are ignored; a file that does
// not read back is skipped with a line appended to *warnings (naming it and why) when warnings
// is not null. Throws Error when the directory exists but cannot be listed.
std::optional<std::string> find_latest_checkpoint(const std::string& run_dir,
                                                  std::vector<std::string>* warnings = nullptr);

// Points <run_dir>/checkpoints/latest at `checkpoint` (its name when it lies in that directory,
// else its path), atomically. Rank 0 only.
void point_latest_checkpoint(const std::string& run_dir, const std::string& checkpoint);

// Moves the checkpoint files of <run_dir>/checkpoints whose step is above `step` into a new
// abandoned-after-step-<step>-<UTC time> directory beside them, and returns its path ("" when
// there were none). Rank 0 only. Throws Error naming a file it cannot move.
std::string set_aside_checkpoints_after(const std::string& run_dir, int64_t step);

// Deletes all but the newest `keep` checkpoints in <run_dir>/checkpoints (keep <= 0: keeps all),
// and temporary files left by an interrupted write. Rank 0 only (not collective), and never while
// a write into that directory is in progress. Throws Error naming a file it cannot delete.
void prune_checkpoints(const std::string& run_dir, int keep);

}  // namespace hpc_train

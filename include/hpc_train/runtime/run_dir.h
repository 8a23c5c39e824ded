// The run directory: where a run leaves its resolved configuration (config.ini), its metrics
// (metrics.jsonl) and its summary (summary.json). Rank 0 creates it and writes the files.
#pragma once

#include <string>

namespace hpc_train {

class Runtime;

// "runs/<UTC date>-<time>" for the current time, e.g. runs/20261202-151400.
std::string default_run_dir();

// Collective. Rank 0 creates `requested` (or default_run_dir() when empty) with its parents;
// every rank gets the path. Ends the job (agreed) with a ConfigError when it cannot be created.
std::string create_run_directory(const Runtime& runtime, const std::string& requested);

// Collective. Rank 0 creates `path` (a monitor's folder) with its parents, so that a folder
// that cannot be made stops the job before training, with a ConfigError naming `options` (e.g.
// "--tensorboard-output-path/--tensorboard-job-name") and the path.
void create_output_directory(const Runtime& runtime, const std::string& path,
                             const std::string& options);

}  // namespace hpc_train

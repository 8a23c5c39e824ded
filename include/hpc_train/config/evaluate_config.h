// `hpc_train evaluate`: the options of the command that evaluates trained weights on a split of
// a dataset (train/evaluate_command.h runs it). The options it shares with training (--model,
// --dataset, --eval-batch, --device, --backend, --threads-per-rank, --reader-threads,
// --comm-timeout) mean what they mean there and land in a TrainConfig, so that placement and
// the evaluation batch are decided by the code that decides them for training.
#pragma once

#include <string>

#include "hpc_train/config/config.h"
#include "hpc_train/data/dataset_file.h"

namespace hpc_train {

// The first argument that makes hpc_train evaluate instead of train.
inline constexpr const char* kEvaluateCommand = "evaluate";

struct EvaluateConfig {
  // --weights (or the first positional argument): a checkpoint file, a run directory or its
  // checkpoints/ (the newest checkpoint, as --resume auto takes it), or a .safetensors file.
  std::string weights;
  Split split = Split::kTest;  // --split train|test
  std::string out_dir;         // --out: where the results go; "" = runs/<UTC timestamp>
  // The shared options; model "" = the model the weights record.
  TrainConfig settings;
};

struct EvaluateCommandLine {
  bool help = false;
  std::string help_text;
  EvaluateConfig config;
};

// Parses the arguments after `hpc_train evaluate` (argv[0] is "evaluate"). Pure: no MPI, no
// output. Throws ConfigError naming the option for an unknown option, a malformed value, an
// unknown split, or no weights.
EvaluateCommandLine parse_evaluate_command_line(int argc, const char* const argv[]);

}  // namespace hpc_train

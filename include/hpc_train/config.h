// The run's configuration: one plain struct with every default in one place, read from the
// command line and an INI file (Boost.ProgramOptions; the command line wins), validated with
// messages that say what to change, and written back as INI (the resolved configuration that
// rank 0 prints and stores in the run directory, readable again with --config).
//
// Defaults are the origin recipe: simple_cnn, micro-batch 64 per rank, 10 epochs,
// AdamW(lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01), seed 42.
#pragma once

#include <cstdint>
#include <string>

namespace hpc_train {

inline constexpr const char* kDefaultDatasetPath = "data/fashion-mnist.h5";

struct TrainConfig {
  // [data]
  std::string dataset_path = kDefaultDatasetPath;  // --dataset
  bool drop_last = false;      // --drop-last: drop the epoch's tail instead of padding it
  int prefetch_batches = 4;    // --prefetch: batches read ahead by the loader thread

  // [model]
  std::string model = "simple_cnn";  // --model: a name from the model registry

  // [training]
  int epochs = 10;                // --epochs
  int64_t max_steps = 0;          // --max-steps: stop after this many optimizer steps; 0 = no limit
  int micro_batch = 64;           // --micro-batch: samples per rank per step
  std::string optimizer = "adamw";  // --optimizer adamw|adam
  double lr = 1e-3;               // --lr
  double beta1 = 0.9;             // --beta1
  double beta2 = 0.999;           // --beta2
  double eps = 1e-8;              // --eps
  double weight_decay = 0.01;     // --weight-decay (decoupled for adamw, L2 for adam)
  uint64_t seed = 42;             // --seed: parameters' initialisation and the epoch plan

  // [runtime]
  int threads_per_rank = 0;       // --threads-per-rank: LibTorch threads; 0 = the node's cores / ranks

  // [output]
  std::string run_dir;            // --run-dir; empty = runs/<UTC timestamp>, chosen by rank 0
  int log_every = 50;             // --log-every: steps between log lines and metrics records
  std::string progress = "auto";  // --progress auto|bar|lines: a bar when stdout is a terminal
};

// What the command line asked for.
struct CommandLine {
  enum class Action { kTrain, kPrintAndExit };
  Action action = Action::kTrain;
  std::string text;  // for kPrintAndExit: --help or --version text, to print on rank 0
  TrainConfig config;
  std::string config_file;  // --config FILE, empty when none
};

// Parses argv (and the --config file it names). Pure: no MPI, no output. Throws ConfigError for
// unknown options, malformed values, unreadable or unknown keys in the INI file.
CommandLine parse_command_line(int argc, const char* const argv[]);

// Checks values that parse but cannot work (micro_batch 0, lr < 0, an unknown optimizer, ...).
// Throws ConfigError that names the option and says what would work. The model name is checked
// by the model registry, and what depends on the world size or the dataset by the trainer.
void validate(const TrainConfig& config);

// The configuration as INI text, grouped by section, every option with its value; reading it
// back with --config gives the same configuration.
std::string to_ini(const TrainConfig& config);

}  // namespace hpc_train

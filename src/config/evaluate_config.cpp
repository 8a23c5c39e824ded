#include "hpc_train/config/evaluate_config.h"

#include <boost/program_options.hpp>

#include <optional>
#include <sstream>
#include <vector>

#include "hpc_train/config/config_choices.h"
#include "hpc_train/error.h"

namespace po = boost::program_options;

namespace hpc_train {
namespace {

std::string see_help(const std::string& message) {
  return message + ". See hpc_train evaluate --help";
}

// `--option text` as the enum it names, or a ConfigError listing the names.
template <class Choice>
Choice choice_option(const po::variables_map& given, const char* option, Choice fallback) {
  if (!given.count(option)) return fallback;
  const std::string text = given[option].as<std::string>();
  const std::optional<Choice> named = parse_choice<Choice>(text);
  if (!named)
    throw ConfigError(see_help("--" + std::string(option) + " " + text + ": must be " +
                               choice_names<Choice>()));
  return *named;
}

}  // namespace

EvaluateCommandLine parse_evaluate_command_line(int argc, const char* const argv[]) {
  const TrainConfig defaults;
  po::options_description options("options of hpc_train evaluate");
  options.add_options()
      ("help", "print this help and exit")
      ("weights", po::value<std::string>(),
       "a checkpoint file (.h5), a run directory or its checkpoints/ (the newest checkpoint), "
       "or a .safetensors weights file; also the first argument without a name")
      ("model", po::value<std::string>(),
       "the model of the weights; default: the one the file records (a TorchScript model's "
       "file must be named here)")
      ("dataset", po::value<std::string>()->default_value(defaults.dataset_path),
       "the HDF5 dataset, as in training")
      ("split", po::value<std::string>()->default_value("test"), "train or test")
      ("out", po::value<std::string>(),
       "directory for evaluation.json, confusion_matrix.csv, predictions.csv; default "
       "runs/<UTC timestamp>")
      ("eval-batch", po::value<int>()->default_value(defaults.eval_batch),
       "samples per rank per batch; 0 = auto, as in training")
      ("device", po::value<std::string>()->default_value(to_string(defaults.device)),
       "auto, cuda or cpu")
      ("backend", po::value<std::string>()->default_value(to_string(defaults.backend)),
       "auto, nccl, mpi or none")
      ("threads-per-rank", po::value<int>()->default_value(defaults.threads_per_rank),
       "LibTorch threads per rank; 0 = the node's cores / ranks")
      ("reader-threads", po::value<int>()->default_value(defaults.reader_threads),
       "a batch's reads in flight")
      ("comm-timeout", po::value<double>()->default_value(defaults.comm_timeout_s),
       "seconds before a stalled collective ends the job; 0 = never");
  po::positional_options_description positional;
  positional.add("weights", 1);
  po::variables_map given;
  try {
    // Boost's parser skips argv[0], here "evaluate".
    po::store(po::command_line_parser(argc, argv)
                  .options(options)
                  .positional(positional)
                  .run(),
              given);
  } catch (const po::error& e) {
    throw ConfigError(see_help(std::string("hpc_train evaluate: ") + e.what()));
  }
  EvaluateCommandLine result;
  if (given.count("help")) {
    std::ostringstream text;
    text << "Usage: mpirun -np N hpc_train evaluate WEIGHTS --dataset FILE.h5 [options]\n"
            "Evaluates the weights on a split of the dataset: loss, top-1, top-5 and per-class\n"
            "accuracy, the confusion matrix and every sample's prediction, written to --out.\n"
         << options;
    result.help = true;
    result.help_text = text.str();
    return result;
  }
  EvaluateConfig& config = result.config;
  if (!given.count("weights") || given["weights"].as<std::string>().empty())
    throw ConfigError(see_help("hpc_train evaluate: give the weights to evaluate (a checkpoint, "
                               "a run directory or a .safetensors file)"));
  config.weights = given["weights"].as<std::string>();
  const std::string split = given["split"].as<std::string>();
  if (split != split_name(Split::kTrain) && split != split_name(Split::kTest))
    throw ConfigError(see_help("--split " + split + ": must be train or test"));
  config.split = split == split_name(Split::kTrain) ? Split::kTrain : Split::kTest;
  if (given.count("out")) config.out_dir = given["out"].as<std::string>();
  TrainConfig& settings = config.settings;
  settings.model = given.count("model") ? given["model"].as<std::string>() : "";
  settings.dataset_path = given["dataset"].as<std::string>();
  settings.eval_batch = given["eval-batch"].as<int>();
  settings.device = choice_option(given, "device", defaults.device);
  settings.backend = choice_option(given, "backend", defaults.backend);
  settings.threads_per_rank = given["threads-per-rank"].as<int>();
  settings.reader_threads = given["reader-threads"].as<int>();
  settings.comm_timeout_s = given["comm-timeout"].as<double>();
  if (settings.eval_batch < 0)
    throw ConfigError(see_help("--eval-batch " + std::to_string(settings.eval_batch) +
                               ": must be 0 (auto) or more"));
  if (settings.reader_threads < 1)
    throw ConfigError(see_help("--reader-threads " + std::to_string(settings.reader_threads) +
                               ": must be 1 or more"));
  if (settings.threads_per_rank < 0 || settings.comm_timeout_s < 0)
    throw ConfigError(see_help("--threads-per-rank and --comm-timeout must be 0 or more"));
  return result;
}

}  // namespace hpc_train

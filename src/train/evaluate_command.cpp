#include "hpc_train/train/evaluate_command.h"

#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hpc_train/comm/comm.h"
#include "hpc_train/config/evaluate_config.h"
#include "hpc_train/data/dataset_file.h"
#include "hpc_train/error.h"
#include "hpc_train/io/atomic_file.h"
#include "hpc_train/io/checkpoint.h"
#include "hpc_train/io/checkpoint_files.h"
#include "hpc_train/io/safetensors.h"
#include "hpc_train/model/initial_weights.h"
#include "hpc_train/model/models.h"
#include "hpc_train/model/torchscript_file.h"
#include "hpc_train/runtime/cpu_binding.h"
#include "hpc_train/runtime/placement.h"
#include "hpc_train/runtime/run_dir.h"
#include "hpc_train/runtime/runtime.h"
#include "hpc_train/train/evaluation.h"
#include "hpc_train/train/run_options.h"
#include "hpc_train/train/trainer.h"
#include "hpc_train/train/training_state.h"

namespace hpc_train {
namespace {

namespace fs = std::filesystem;

bool is_safetensors(const std::string& path) { return fs::path(path).extension() == ".safetensors"; }

// The file --weights names: a directory is a run directory, or its checkpoints/, whose newest
// complete checkpoint of the current branch is taken, as --resume auto takes it.
std::string weights_file(const std::string& weights, int rank) {
  if (!fs::exists(weights))
    throw DataError(weights + ": no such file or directory (the weights: a checkpoint, a run "
                              "directory or a .safetensors file)");
  if (!fs::is_directory(weights)) return weights;
  fs::path run_dir = fs::path(weights).lexically_normal();
  if (!run_dir.has_filename()) run_dir = run_dir.parent_path();
  if (!fs::is_directory(checkpoint_directory(run_dir.string())) &&
      run_dir.filename() == fs::path(checkpoint_directory("")).filename())
    run_dir = run_dir.has_parent_path() ? run_dir.parent_path() : fs::path(".");
  std::vector<std::string> warnings;
  const std::optional<std::string> newest = find_latest_checkpoint(run_dir.string(), &warnings);
  if (rank == 0)
    for (const std::string& warning : warnings) std::fprintf(stderr, "warning: %s\n", warning.c_str());
  if (!newest)
    throw DataError(weights + ": no complete checkpoint in " +
                    checkpoint_directory(run_dir.string()));
  return *newest;
}

// The model to build for the weights of `path`: --model (`option`) where given, else the one the
// file records (`recorded`, "" when it records none).
std::string model_to_build(const std::string& path, const std::string& recorded,
                           const std::string& option) {
  if (!option.empty()) {
    // A TorchScript file's identity is checked against the checkpoint's once it is loaded.
    if (!recorded.empty() && !names_torchscript_file(option) && recorded != option)
      throw DataError(path + ": the weights are " + recorded + "'s, not " + option +
                      "'s (--model); leave --model out to take the file's");
    return option;
  }
  if (recorded.empty())
    throw DataError(path + ": the file does not say which model its weights are (no \"model\" "
                           "in its metadata); name it with --model");
  if (recorded.rfind(kTorchScriptIdentityPrefix, 0) == 0)
    throw DataError(path + ": the weights are of a TorchScript model (" + recorded +
                    "); name its file with --model FILE.pt");
  return recorded;
}

// The model of the weights in `path` (a checkpoint or a safetensors file), built for `input`,
// with the weights loaded, on the CPU in fp32. Throws DataError naming the file when it is
// missing, foreign, or of another model or input; ConfigError for an unknown model name.
std::unique_ptr<TrainableModel> load_trained_model(const std::string& path,
                                                   const std::string& model_option,
                                                   const DatasetInfo& input) {
  const ModelShape shape{input.channels, input.height, input.width, input.num_classes};
  if (is_safetensors(path)) {
    const SafetensorsHeader header = read_safetensors_header(path);
    const auto recorded = header.metadata.find("model");
    const std::string name = model_to_build(
        path, recorded == header.metadata.end() ? "" : recorded->second, model_option);
    std::unique_ptr<TrainableModel> model = load_model(name, shape);
    load_initial_weights(path, /*partial=*/false, *model, name);
    return model;
  }
  const Checkpoint checkpoint = read_checkpoint(path);
  std::unique_ptr<TrainableModel> model =
      load_model(model_to_build(path, checkpoint.model, model_option), shape);
  restore_model_state(checkpoint, path, input, *model);
  return model;
}

// One row per label, one column per predicted class.
std::string confusion_csv(const EvalResult& result) {
  std::string text = "label";
  for (int64_t predicted = 0; predicted < result.num_classes; ++predicted)
    text += ",predicted_" + std::to_string(predicted);
  text += "\n";
  for (int64_t label = 0; label < result.num_classes; ++label) {
    text += std::to_string(label);
    for (int64_t predicted = 0; predicted < result.num_classes; ++predicted)
      text += "," + std::to_string(result.confusion[label * result.num_classes + predicted]);
    text += "\n";
  }
  return text;
}

std::string predictions_csv(const SplitPredictions& predictions) {
  const int64_t k = predictions.top_classes_per_sample;
  std::string text = "index,label,predicted";
  for (int64_t i = 1; i <= k; ++i) text += ",class_" + std::to_string(i);
  for (int64_t i = 1; i <= k; ++i) text += ",probability_" + std::to_string(i);
  text += "\n";
  char number[32];
  for (size_t row = 0; row < predictions.index.size(); ++row) {
    text += std::to_string(predictions.index[row]) + "," + std::to_string(predictions.label[row]) +
            "," + std::to_string(predictions.predicted[row]);
    for (int64_t i = 0; i < k; ++i)
      text += "," + std::to_string(predictions.top_classes[row * k + i]);
    for (int64_t i = 0; i < k; ++i) {
      std::snprintf(number, sizeof number, ",%.9g", predictions.top_probabilities[row * k + i]);
      text += number;
    }
    text += "\n";
  }
  return text;
}

nlohmann::json evaluation_json(const EvalResult& result, const EvaluateConfig& config,
                               const std::string& weights, const std::string& model,
                               const DatasetInfo& info, int world_size) {
  nlohmann::json record = result.to_json("");
  record["class_samples"] = result.class_samples();
  record["class_names"] = info.class_names;
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t label = 0; label < result.num_classes; ++label)
    rows.push_back(std::vector<int64_t>(result.confusion.begin() + label * result.num_classes,
                                        result.confusion.begin() + (label + 1) * result.num_classes));
  record["confusion_matrix"] = rows;
  record["weights"] = weights;
  record["model"] = model;
  record["dataset"] = config.settings.dataset_path;
  record["split"] = split_name(config.split);
  record["world_size"] = world_size;
  return record;
}

}  // namespace

int run_evaluate_command(int argc, char** argv) {
  // --help answers without MPI, as training's does (main.cpp); a command line that does not
  // parse is parsed again below, so that every rank reports it.
  std::optional<EvaluateCommandLine> before_mpi;
  try {
    before_mpi = parse_evaluate_command_line(argc - 1, argv + 1);
  } catch (const std::exception&) {
  }
  if (before_mpi && before_mpi->help) {
    if (launcher_rank() == 0) std::printf("%s", before_mpi->help_text.c_str());
    return kExitOk;
  }
  // Before the first thread of ours (Note [Open MPI's default core binding]).
  const std::string cpu_binding = undo_default_core_binding();
  Runtime runtime(&argc, &argv, launcher_one_node());  // Note [Single-node MPI transport]
  return run_or_abort(runtime, [&] {
    EvaluateConfig config;
    run_agreed_phase(runtime, [&] {
      config = (before_mpi ? *before_mpi : parse_evaluate_command_line(argc - 1, argv + 1)).config;
    });
    TrainConfig& settings = config.settings;
    config.out_dir = create_run_directory(runtime, config.out_dir);
    int threads = 0;
    run_agreed_phase(runtime, [&] {
      threads = compute_threads_per_rank(runtime.local_size(), settings.threads_per_rank);
    });
    set_compute_threads(threads);
    const Placement placement = agree_placement(runtime, settings);
    std::optional<DatasetFile> dataset;
    std::string weights;
    std::unique_ptr<TrainableModel> model;
    run_agreed_phase(runtime, [&] {
      dataset.emplace(DatasetFile::open(settings.dataset_path,
                                        preferred_file_access(runtime.thread_multiple()),
                                        runtime.world(), settings.reader_threads));
      weights = weights_file(config.weights, runtime.rank());
      model = load_trained_model(weights, settings.model, dataset->info());
    });
    const DatasetInfo& info = dataset->info();
    if (runtime.rank() == 0) {
      std::printf("hpc_train %s evaluate: %d rank(s); rank 0 on %s; %d CPU thread(s) per rank\n"
                  "%s%s",
                  HPC_TRAIN_VERSION, runtime.world_size(), placement.describe().c_str(), threads,
                  cpu_binding.c_str(), cpu_binding.empty() ? "" : "\n");
      std::fflush(stdout);
    }

    // Not an agreed phase from here (Note [Ending the job] in runtime.h): collectives follow.
    Communicator comm(runtime.world(), placement.backend, placement.cuda_device);
    comm.set_timeout(settings.comm_timeout_s);
    const torch::Device device =
        placement.cuda ? torch::Device(torch::kCUDA,
                                       static_cast<c10::DeviceIndex>(placement.cuda_device))
                       : torch::Device(torch::kCPU);
    model->to(device, torch::kFloat);  // the weights as saved: fp32
    Evaluator evaluator(*dataset, config.split, device, torch::kFloat,
                        placement.cuda && settings.channels_last, settings.seed,
                        evaluation_batch(settings, info, comm.size(), placement.cuda, config.split),
                        settings.prefetch_batches, comm);
    SplitPredictions predictions;
    const EvalResult result = evaluator.evaluate(*model, &predictions);

    if (runtime.rank() == 0) {
      const nlohmann::json record = evaluation_json(result, config, weights, model->identity(),
                                                    info, runtime.world_size());
      write_file_atomically(config.out_dir + "/evaluation.json", record.dump(2) + "\n");
      write_file_atomically(config.out_dir + "/confusion_matrix.csv", confusion_csv(result));
      write_file_atomically(config.out_dir + "/predictions.csv", predictions_csv(predictions));
      std::printf("Evaluated %s (%s) on the %s split of %s: %lld samples, loss %.4f, accuracy %.2f%% "
                  "(%lld/%lld)%s\nResults: %s\n",
                  weights.c_str(), model->identity().c_str(), split_name(config.split),
                  settings.dataset_path.c_str(), static_cast<long long>(result.samples),
                  result.loss, 100.0 * result.accuracy,
                  static_cast<long long>(result.correct), static_cast<long long>(result.samples),
                  result.describe_top5_and_classes().c_str(), config.out_dir.c_str());
    }
    return kExitOk;
  });
}

}  // namespace hpc_train

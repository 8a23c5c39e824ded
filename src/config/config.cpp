// The command line and the INI file (Boost.ProgramOptions), validation, and the INI writer.
//
// Note [One table of options]: every option is one row of kOptions (name, section, field, help).
// The command-line option --name, the INI key (the name with _ for -) under [section], the --help
// line and the to_ini() line are all generated from that row, and its default is what TrainConfig{}
// holds (config.h keeps every default in one place). A new option is a field in config.h and a
// row here; a new field type is one more alternative in FieldPtr plus its parse/format overloads.
// A choice (config_choices.h) is one more alternative too; its parse/format overloads are the
// generic ones over its name table, so that a name no value has, e.g. --precision fp8, fails
// here, naming the option, the value and the names that would work, on the command line and in
// the INI file alike.
//
// Values go through Boost as text and are converted here, so that a malformed value gets a
// message that names the option, the value and what would work, and no Boost exception escapes.
#include "hpc_train/config/config.h"

#include <boost/program_options.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "config/edit_distance.h"
#include "hpc_train/data/dataset_file.h"
#include "hpc_train/data/epoch_plan.h"
#include "hpc_train/error.h"
#include "hpc_train/io/reader_threads.h"
#include "hpc_train/model/model_names.h"
#include "hpc_train/runtime/runtime.h"

namespace hpc_train {
namespace {

namespace po = boost::program_options;

using FieldPtr = std::variant<std::string TrainConfig::*, bool TrainConfig::*, int TrainConfig::*,
                              int64_t TrainConfig::*, uint64_t TrainConfig::*,
                              double TrainConfig::*, Switch TrainConfig::*,
                              OptimizerKind TrainConfig::*, LambBiasCorrection TrainConfig::*,
                              LrScheduleKind TrainConfig::*,
                              WarmupType TrainConfig::*, Precision TrainConfig::*,
                              DeviceChoice TrainConfig::*, BackendChoice TrainConfig::*,
                              ProgressStyle TrainConfig::*, DataStore TrainConfig::*,
                              GradientDtype TrainConfig::*>;

struct OptionSpec {
  const char* name;     // --name on the command line; INI key: name with _ for -
  const char* section;  // [section] in the INI file, and the --help group
  FieldPtr field;
  const char* help;
};

struct SectionSpec {
  const char* name;
  const char* caption;
};

// INI sections and --help groups, in the order they are printed.
const SectionSpec kSections[] = {{"data", "Data"},
                                 {"model", "Model"},
                                 {"training", "Training"},
                                 {"zero", "ZeRO and precision"},
                                 {"comm", "Gradient communication"},
                                 {"runtime", "Runtime"},
                                 {"checkpoint", "Checkpoints"},
                                 {"output", "Output"}};

// --model's help lists the registry's names (model_names.h), so that --help shows every model.
const std::string kModelHelp = "a name in the model registry (" + model_names_text() +
                               ") or a TorchScript file: a path ending in .pt or .pth, or holding "
                               "a '/'";

// Note [One table of options]
const OptionSpec kOptions[] = {
    {"dataset", "data", &TrainConfig::dataset_path,
     "HDF5 dataset file (hpc_train_data makes one), or its shards: a quoted pattern "
     "('data/x-*.h5') or a shard index file (hpc_train_data shard writes both)"},
    {"drop-last", "data", &TrainConfig::drop_last, "drop each epoch's tail instead of padding it"},
    {"prefetch", "data", &TrainConfig::prefetch_batches, "batches read ahead by the loader thread"},
    {"reader-threads", "data", &TrainConfig::reader_threads,
     "reads of a batch's samples in flight at once, a rank (1 = one after another)"},
    {"augment", "data", &TrainConfig::augment,
     "random crop (4 px) + flip: auto (3-channel images of 32 px or more), on or off"},
    {"resident-data", "data", &TrainConfig::resident_data,
     "keep the train split on the device (and the test split, where both fit): auto (on a GPU, "
     "up to 4 GiB, a quarter of its memory and half its free memory), on (refused beyond its "
     "free memory) or off"},
    {"data-store", "data", &TrainConfig::data_store,
     "file (read the train split's batches from the dataset) or memory (each rank reads 1/N of "
     "it once, batches are exchanged over MPI)"},
    {"data-store-limit-mb", "data", &TrainConfig::data_store_limit_mb,
     "host memory (MiB) a rank's share of --data-store memory may take; 0 = the node's "
     "MemAvailable / its ranks"},
    {"model", "model", &TrainConfig::model, kModelHelp.c_str()},
    {"init-weights", "model", &TrainConfig::init_weights,
     "start from this PyTorch state_dict (.safetensors), strictly: every tensor by name and shape"},
    {"init-weights-partial", "model", &TrainConfig::init_weights_partial,
     "load the tensors of --init-weights that fit, list the others"},
    {"epochs", "training", &TrainConfig::epochs, "passes over the training set"},
    {"max-steps", "training", &TrainConfig::max_steps, "stop after this many steps; 0 = no limit"},
    {"micro-batch", "training", &TrainConfig::micro_batch, "samples per rank per step"},
    {"eval-batch", "training", &TrainConfig::eval_batch,
     "samples per rank per evaluation batch; 0 = auto (on a GPU as many as 16 MiB of float32 "
     "input holds, 256 to 4096; 256 on the CPU)"},
    {"optimizer", "training", &TrainConfig::optimizer, "adamw, adam, sgd, lamb or lars"},
    {"lr", "training", &TrainConfig::lr, "learning rate"},
    {"beta1", "training", &TrainConfig::beta1, "Adam's (and LAMB's) first-moment decay"},
    {"beta2", "training", &TrainConfig::beta2, "Adam's (and LAMB's) second-moment decay"},
    {"eps", "training", &TrainConfig::eps, "Adam's and LAMB's denominator epsilon, LARS's in its trust ratio"},
    {"weight-decay", "training", &TrainConfig::weight_decay,
     "decoupled for adamw and lamb, L2 for adam, sgd and lars"},
    {"no-decay-bias-bn", "training", &TrainConfig::no_decay_bias_bn,
     "no weight decay on biases and normalisation weights (every parameter of fewer than 2 "
     "dimensions), as torchvision's --norm-weight-decay 0 --bias-weight-decay 0"},
    {"ema-decay", "training", &TrainConfig::ema_decay,
     "keep an exponential moving average of the weights with this decay (e.g. 0.999), "
     "evaluated and exported beside them; 0 = none"},
    {"label-smoothing", "training", &TrainConfig::label_smoothing,
     "the training loss's label smoothing in [0, 1) (torch.nn.CrossEntropyLoss's); 0 = none"},
    {"momentum", "training", &TrainConfig::momentum,
     "SGD's and LARS's momentum; 0 = none (plain SGD)"},
    {"dampening", "training", &TrainConfig::dampening,
     "SGD's and LARS's dampening of the momentum"},
    {"nesterov", "training", &TrainConfig::nesterov, "SGD or LARS with Nesterov momentum"},
    {"trust-coefficient", "training", &TrainConfig::trust_coefficient,
     "LARS: eta in eta |w| / (|g| + weight decay |w|)"},
    {"min-trust-ratio", "training", &TrainConfig::min_trust_ratio,
     "LAMB: the trust ratio's lower bound (DeepSpeed's min_coeff); 0 = none"},
    {"max-trust-ratio", "training", &TrainConfig::max_trust_ratio,
     "LAMB: the trust ratio's upper bound (DeepSpeed's max_coeff); 0 = none"},
    {"lamb-bias-correction", "training", &TrainConfig::lamb_bias_correction,
     "LAMB: where the moments' bias is corrected: moments (the paper), step (DeepSpeed's "
     "FusedLamb) or none"},
    {"seed", "training", &TrainConfig::seed, "seeds initialisation and the epoch plan"},
    {"grad-accum", "training", &TrainConfig::grad_accum, "micro-steps per optimizer step"},
    {"clip-grad", "training", &TrainConfig::clip_grad,
     "max global gradient norm; 0 = no clipping"},
    {"lr-schedule", "training", &TrainConfig::lr_schedule,
     "constant, warmup, warmup-cosine, warmup-decay, one-cycle or multistep"},
    {"warmup-steps", "training", &TrainConfig::warmup_steps,
     "optimizer steps of warm-up; 0 = none"},
    {"warmup-type", "training", &TrainConfig::warmup_type,
     "linear or log (DeepSpeed's default is log)"},
    {"warmup-start-ratio", "training", &TrainConfig::warmup_start_ratio,
     "lr at step 0, as a fraction of --lr"},
    {"cosine-final-ratio", "training", &TrainConfig::cosine_final_ratio,
     "lr at the cosine's end, as a fraction of --lr"},
    {"schedule-steps", "training", &TrainConfig::schedule_steps,
     "the step where the cosine or decay ends; 0 = the run's end"},
    {"cycle-min-ratio", "training", &TrainConfig::cycle_min_ratio,
     "one-cycle: the lowest lr, as a fraction of --lr (the peak)"},
    {"cycle-first-steps", "training", &TrainConfig::cycle_first_steps,
     "one-cycle: steps up; 0 = half the run"},
    {"cycle-second-steps", "training", &TrainConfig::cycle_second_steps,
     "one-cycle: steps down; 0 = as many as up"},
    {"cycle-decay-steps", "training", &TrainConfig::cycle_decay_steps,
     "one-cycle: the decay's step size after the cycle; 0 = no decay"},
    {"cycle-decay-lr-rate", "training", &TrainConfig::cycle_decay_lr_rate,
     "one-cycle: lr = min / (1 + rate x steps after / --cycle-decay-steps)"},
    {"cycle-decay-momentum-rate", "training", &TrainConfig::cycle_decay_momentum_rate,
     "one-cycle: momentum = max x (1 + rate x steps after / --cycle-decay-steps)"},
    {"cycle-momentum", "training", &TrainConfig::cycle_momentum,
     "one-cycle: cycle SGD's or LARS's momentum (Adam's or LAMB's beta1) against the lr"},
    {"cycle-min-momentum", "training", &TrainConfig::cycle_min_momentum,
     "one-cycle: the momentum at the lr's peak"},
    {"cycle-max-momentum", "training", &TrainConfig::cycle_max_momentum,
     "one-cycle: the momentum at the lr's lowest"},
    {"lr-milestones", "training", &TrainConfig::lr_milestones,
     "multistep: optimizer steps where the lr is multiplied by --lr-gamma, e.g. 3000,6000"},
    {"lr-milestone-epochs", "training", &TrainConfig::lr_milestone_epochs,
     "multistep: epochs after which the lr is multiplied by --lr-gamma, e.g. 30,60,80 "
     "(torchvision's --lr-steps)"},
    {"lr-gamma", "training", &TrainConfig::lr_gamma, "multistep: the lr's factor at a milestone"},
    {"zero-stage", "zero", &TrainConfig::zero_stage,
     "0 none; 1 optimizer state; 2 also gradients"},
    {"precision", "zero", &TrainConfig::precision, "fp32, fp16 or bf16 (the model's dtype)"},
    {"grad-accum-dtype", "zero", &TrainConfig::grad_accum_dtype,
     "fp16/bf16 with --grad-accum > 1: the micro-steps' gradients add up in the model's dtype "
     "(model) or in fp32 (fp32: 4 more bytes a parameter, none more with --comm-dtype fp32)"},
    {"loss-scale", "zero", &TrainConfig::loss_scale, "fixed fp16 loss scale; 0 = dynamic"},
    {"initial-scale-power", "zero", &TrainConfig::initial_scale_power,
     "the dynamic loss scale starts at 2^N"},
    {"loss-scale-window", "zero", &TrainConfig::loss_scale_window,
     "clean steps before the dynamic scale doubles"},
    {"hysteresis", "zero", &TrainConfig::hysteresis, "overflows tolerated before halving"},
    {"min-loss-scale", "zero", &TrainConfig::min_loss_scale,
     "an overflow at this scale stops the run"},
    {"bucket-mb", "comm", &TrainConfig::bucket_mb,
     "gradient bucket size, MiB; 0: 25, or at ZeRO stage 2 across ranks an eighth of the "
     "gradients, at most 4"},
    {"first-bucket-mb", "comm", &TrainConfig::first_bucket_mb,
     "the first (last layers') bucket, MiB"},
    {"overlap-comm", "comm", &TrainConfig::overlap_comm,
     "reduce a full bucket while backward goes on"},
    {"comm-dtype", "comm", &TrainConfig::comm_dtype,
     "fp16/bf16: the ranks sum the gradients, and the optimizer reads them, in the model's "
     "dtype (model) or in fp32 (fp32: gradient buffers and traffic twice the size)"},
    {"device", "runtime", &TrainConfig::device,
     "auto (a GPU per rank where there are GPUs), cuda or cpu"},
    {"backend", "runtime", &TrainConfig::backend,
     "gradient collectives: auto (none for one rank, else nccl on GPUs, else mpi), nccl, mpi "
     "or none (one rank)"},
    {"threads-per-rank", "runtime", &TrainConfig::threads_per_rank,
     "LibTorch threads, at most the node's hardware threads; 0 = cores per node / ranks"},
    {"comm-timeout", "runtime", &TrainConfig::comm_timeout_s,
     "seconds a collective or a CUDA-graph replay may take before the job ends; 0 = no limit"},
    {"cuda-graph", "runtime", &TrainConfig::cuda_graph,
     "replay each GPU step as one CUDA graph: off, auto (fall back to eager) or on"},
    {"channels-last", "runtime", &TrainConfig::channels_last,
     "GPU: convolution inputs and weights NHWC (channels-last)"},
    {"cudnn-benchmark", "runtime", &TrainConfig::cudnn_benchmark,
     "GPU: time cuDNN's convolution algorithms for the micro-batch's shape (once, in the first "
     "steps) and keep the fastest; other shapes use cuDNN's heuristics"},
    {"fused-batch-norm", "runtime", &TrainConfig::fused_batch_norm,
     "GPU: the built-in ResNets' batch norm, ReLU and residual add as fused kernels in "
     "training (channels-last); off: LibTorch's batch norm"},
    {"fused-pooling", "runtime", &TrainConfig::fused_pooling,
     "GPU: simple_cnn's max pooling, bias and ReLU as one fused kernel (channels-last); off: "
     "LibTorch's max pooling, add and ReLU"},
    {"deterministic", "runtime", &TrainConfig::deterministic,
     "GPU: deterministic cuDNN algorithms, so that a run (and a resumed run) repeats bit for bit"},
    {"cuda-profiler-start-step", "runtime", &TrainConfig::cuda_profiler_start_step,
     "GPU: start the CUDA profiler's capture at this step (ncu --profile-from-start off, nsys "
     "--capture-range=cudaProfilerApi); 0 = never"},
    {"cuda-profiler-steps", "runtime", &TrainConfig::cuda_profiler_steps,
     "steps the CUDA profiler's capture lasts"},
    {"checkpoint-every", "checkpoint", &TrainConfig::checkpoint_every,
     "steps between checkpoints; 0 = off"},
    {"checkpoint-every-minutes", "checkpoint", &TrainConfig::checkpoint_every_minutes,
     "wall-clock minutes between checkpoints, by rank 0's clock since the last checkpoint "
     "written; 0 = off. Either rule being due writes one"},
    {"checkpoint-epochs", "checkpoint", &TrainConfig::checkpoint_epochs,
     "write a checkpoint at the end of every epoch"},
    {"keep-checkpoints", "checkpoint", &TrainConfig::keep_checkpoints,
     "newest checkpoints kept in the run directory; 0 = all"},
    {"resume", "checkpoint", &TrainConfig::resume,
     "auto (the run directory's newest checkpoint, if any) or a checkpoint file"},
    {"export-weights", "checkpoint", &TrainConfig::export_weights,
     "write the final weights to this .safetensors file"},
    {"run-dir", "output", &TrainConfig::run_dir, "logs, metrics; empty = runs/<UTC timestamp>"},
    {"log-every", "output", &TrainConfig::log_every, "steps between log lines and metrics"},
    {"progress", "output", &TrainConfig::progress, "auto (a bar on a terminal), bar or lines"},
    {"tensorboard", "output", &TrainConfig::tensorboard,
     "write TensorBoard event files (DeepSpeed's tags) in <output path>/<job name>"},
    {"tensorboard-output-path", "output", &TrainConfig::tensorboard_output_path,
     "TensorBoard's output path; empty = the run directory"},
    {"tensorboard-job-name", "output", &TrainConfig::tensorboard_job_name,
     "TensorBoard's folder under its output path"},
    {"csv-monitor", "output", &TrainConfig::csv_monitor,
     "write one CSV file per scalar (DeepSpeed's csv_monitor) in <output path>/<job name>"},
    {"csv-monitor-output-path", "output", &TrainConfig::csv_monitor_output_path,
     "the CSV monitor's output path; empty = the run directory"},
    {"csv-monitor-job-name", "output", &TrainConfig::csv_monitor_job_name,
     "the CSV monitor's folder under its output path"},
};

// Boost's default style, less guessing: "--epoch" must not silently mean "--epochs".
constexpr int kCommandLineStyle =
    po::command_line_style::default_style & ~po::command_line_style::allow_guessing;

// "<message>. <next>", without doubling a '?' or '.' at the message's end.
std::string and_then(const std::string& message, const std::string& next) {
  const bool ends_sentence = !message.empty() && (message.back() == '?' || message.back() == '.');
  return message + (ends_sentence ? " " : ". ") + next;
}

std::string see_help(const std::string& message) {
  return and_then(message, "See hpc_train --help");
}

std::string ini_key(const OptionSpec& option) {
  std::string key = option.name;
  std::replace(key.begin(), key.end(), '-', '_');
  return key;
}

// How Boost's INI parser names a key: "section.key".
std::string dotted_key(const OptionSpec& option) {
  return std::string(option.section) + "." + ini_key(option);
}

// --- Values as text, both ways. Parsers return what was wrong, or "" when the text fit.

std::string format_value(const std::string& value) { return value; }
std::string format_value(bool value) { return value ? "true" : "false"; }
template <class Int, std::enable_if_t<std::is_integral_v<Int>, int> = 0>
std::string format_value(Int value) {
  return std::to_string(value);
}
// Shortest of %.15g and %.17g that reads back to the same double: 0.001 stays 0.001.
std::string format_value(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.15g", value);
  if (std::strtod(text, nullptr) != value) std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}
template <class Choice, std::enable_if_t<is_choice_v<Choice>, int> = 0>
std::string format_value(Choice value) {
  return to_string(value);
}

std::string parse_value(const std::string& text, std::string& value) {
  value = text;
  return "";
}
std::string parse_value(const std::string& text, bool& value) {
  static const std::pair<std::string_view, bool> kWords[] = {
      {"true", true}, {"false", false}, {"yes", true}, {"no", false},
      {"on", true},   {"off", false},   {"1", true},   {"0", false}};
  for (const auto& [word, meaning] : kWords) {
    if (text == word) {
      value = meaning;
      return "";
    }
  }
  return "expected true or false";
}
template <class Int, std::enable_if_t<std::is_integral_v<Int>, int> = 0>
std::string parse_value(const std::string& text, Int& value) {
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error == std::errc::result_out_of_range) {
    return "out of range (" + std::to_string(std::numeric_limits<Int>::min()) + " to " +
           std::to_string(std::numeric_limits<Int>::max()) + ")";
  }
  if (error != std::errc() || stop != end) {
    return std::is_signed_v<Int> ? "expected a whole number" : "expected a whole number >= 0";
  }
  return "";
}
std::string parse_value(const std::string& text, double& value) {
  errno = 0;
  char* stop = nullptr;
  const double parsed = std::strtod(text.c_str(), &stop);
  if (text.empty() || stop != text.c_str() + text.size()) return "expected a number like 0.001";
  if (errno == ERANGE && std::isinf(parsed)) return "out of range for a double";
  value = parsed;
  return "";
}
template <class Choice, std::enable_if_t<is_choice_v<Choice>, int> = 0>
std::string parse_value(const std::string& text, Choice& value) {
  const std::optional<Choice> named = parse_choice<Choice>(text);
  if (!named) return "must be " + choice_names<Choice>();
  value = *named;
  return "";
}

std::string format_field(const TrainConfig& config, const FieldPtr& field) {
  return std::visit([&](auto member) { return format_value(config.*member); }, field);
}

std::string parse_field(const std::string& text, TrainConfig& config, const FieldPtr& field) {
  return std::visit([&](auto member) { return parse_value(text, config.*member); }, field);
}

bool is_flag(const OptionSpec& option) {
  return std::holds_alternative<bool TrainConfig::*>(option.field);
}

// --- Suggestions for misspelt names.

// "; did you mean X?" for the nearest candidate, or "" when none is near.
std::string suggestion(const std::string& name, const std::vector<std::string>& candidates) {
  const std::string* nearest = nullptr;
  size_t nearest_distance = std::max<size_t>(2, name.size() / 3) + 1;
  for (const std::string& candidate : candidates) {
    const size_t distance = edit_distance(name, candidate);
    if (distance < nearest_distance) {
      nearest = &candidate;
      nearest_distance = distance;
    }
  }
  return nearest ? "; did you mean " + *nearest + "?" : "";
}

// --- The command line.

// --help columns: 80 wide, with room for a description on the option's line for most options.
constexpr unsigned kHelpWidth = 80;
constexpr unsigned kHelpDescriptionWidth = 46;

po::options_description command_line_options(const TrainConfig& defaults) {
  po::options_description all(kHelpWidth, kHelpDescriptionWidth);
  po::options_description general("General", kHelpWidth, kHelpDescriptionWidth);
  general.add_options()("help,h", "print this help and exit")(
      "version", "print the version, the commit and the libraries built with (LibTorch, CUDA, cuDNN, NCCL, MPI, HDF5, ...) and exit")(
      "config", po::value<std::string>()->value_name("FILE"),
      "read options from this INI file")(
      "deepspeed-config", po::value<std::string>()->value_name("FILE"),
      "map a DeepSpeed ds_config.json onto options")(
      "deepspeed-allow-unknown",
      po::value<std::string>()->implicit_value("true", "")->value_name("[=true|false]")
          ->default_value("false"),
      "unknown ds_config keys warn instead of failing");
  all.add(general);
  for (const SectionSpec& section : kSections) {
    po::options_description group(std::string(section.caption) + " [" + section.name + "]",
                                  kHelpWidth, kHelpDescriptionWidth);
    for (const OptionSpec& option : kOptions) {
      if (std::string_view(option.section) != section.name) continue;
      // Every value travels as text (see the top of this file); the default shown is to_ini's.
      const std::string shown_default = format_field(defaults, option.field);
      po::typed_value<std::string>* value = po::value<std::string>();
      if (is_flag(option)) {
        // A flag: --drop-last alone means true; --drop-last=false (or "false" next) says false.
        value->implicit_value("true", "")->value_name("[=true|false]");
      } else {
        value->value_name(std::visit(
            [](auto member) {
              using T = std::remove_reference_t<decltype(TrainConfig().*member)>;
              return std::is_same_v<T, double> ? "X" : std::is_integral_v<T> ? "N" : "TEXT";
            },
            option.field));
      }
      if (!shown_default.empty()) value->default_value(shown_default);
      group.add_options()(option.name, value, option.help);
    }
    all.add(group);
  }
  return all;
}

std::string help_text(const po::options_description& options) {
  std::ostringstream text;
  text << "Usage: hpc_train [options]\n"
          "       mpirun -np N hpc_train [options]\n"
          "       mpirun -np N hpc_train evaluate WEIGHTS [options]   (hpc_train evaluate --help)\n"
          "\n"
          "Every option may also be given in an INI file passed with --config FILE, as\n"
          "'name = value' (the name with _ for -) under its [section]. The command line\n"
          "wins over the file, and the file over the defaults shown as (=...).\n"
          "A DeepSpeed ds_config.json (--deepspeed-config FILE) overrides the INI file\n"
          "and the defaults, but not what is given on the command line.\n"
       << options;
  return text.str();
}

std::vector<std::string> command_line_names() {
  std::vector<std::string> names = {"--help", "--version", "--config", "--deepspeed-config",
                                    "--deepspeed-allow-unknown"};
  for (const OptionSpec& option : kOptions) names.push_back(std::string("--") + option.name);
  return names;
}

// Boost was told to let unknown options through, so that the message here can suggest a name.
void reject_unknown_arguments(const po::parsed_options& parsed) {
  for (const po::option& option : parsed.options) {
    const std::string token =
        option.original_tokens.empty() ? option.string_key : option.original_tokens.front();
    if (option.unregistered) {
      const std::string name = token.substr(0, token.find('='));
      throw ConfigError(
          see_help("unknown option " + name + suggestion(name, command_line_names())));
    }
    if (option.string_key.empty()) {
      throw ConfigError(see_help("unexpected argument '" + token +
                                 "': hpc_train takes only options, as --name value (a "
                                 "true/false option as --name or --name=false)"));
    }
  }
}

bool on_command_line(const po::variables_map& values, const char* name) {
  return values.count(name) && !values[name].defaulted();
}

// --- The INI file.

struct IniValue {
  std::string text;
  int line;
};

std::string trim(const std::string& text) {
  const char* kBlanks = " \t\r\n";
  const size_t first = text.find_first_not_of(kBlanks);
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(kBlanks) - first + 1);
}

std::string describe_key(const std::string& dotted) {
  const size_t dot = dotted.find('.');
  if (dot == std::string::npos) return "'" + dotted + "' (outside any section)";
  return "'" + dotted.substr(dot + 1) + "' in [" + dotted.substr(0, dot) + "]";
}

// The line of each key ("section.key" -> line), reading the file the way Boost's parser does,
// which reports neither line numbers nor a key given twice (it would keep both).
std::map<std::string, int> index_ini_lines(const std::string& text, const std::string& path) {
  std::map<std::string, int> line_of_key;
  std::istringstream lines(text);
  std::string line;
  std::string section;
  for (int number = 1; std::getline(lines, line); ++number) {
    const std::string where = path + ":" + std::to_string(number) + ": ";
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    if (line.front() == '[' && line.back() == ']') {
      section = line.substr(1, line.size() - 2);
      if (section.empty()) throw ConfigError(where + "empty section name []");
      continue;
    }
    const size_t equals = line.find('=');
    const std::string key = trim(line.substr(0, equals));
    if (equals == std::string::npos || key.empty()) {
      throw ConfigError(where + "'" + line + "' is neither '[section]' nor 'key = value'");
    }
    const std::string dotted = section.empty() ? key : section + "." + key;
    const auto [first, inserted] = line_of_key.emplace(dotted, number);
    if (!inserted) {
      throw ConfigError(where + describe_key(dotted) + " was already set on line " +
                        std::to_string(first->second) + "; keep one of them");
    }
  }
  return line_of_key;
}

const OptionSpec* find_by_ini_key(const std::string& key) {
  for (const OptionSpec& option : kOptions) {
    if (ini_key(option) == key) return &option;
  }
  return nullptr;
}

[[noreturn]] void reject_unknown_key(const std::string& dotted, const std::string& where) {
  std::vector<std::string> sections;
  for (const SectionSpec& known : kSections) sections.emplace_back(known.name);
  const size_t dot = dotted.find('.');
  const std::string section = dot == std::string::npos ? "" : dotted.substr(0, dot);
  const std::string key = dot == std::string::npos ? dotted : dotted.substr(dot + 1);
  const OptionSpec* known_key = find_by_ini_key(key);
  if (dot != std::string::npos &&
      std::find(sections.begin(), sections.end(), section) == sections.end()) {
    std::string known_sections = "The sections are";
    for (std::string& name : sections) known_sections += " " + (name = "[" + name + "]");
    throw ConfigError(see_help(and_then(
        where + "unknown section [" + section + "]" + suggestion("[" + section + "]", sections),
        known_sections)));
  }
  if (known_key) {
    throw ConfigError(where + describe_key(dotted) + ": " + key + " belongs under [" +
                      known_key->section + "]");
  }
  std::vector<std::string> keys;
  for (const OptionSpec& option : kOptions) {
    if (section.empty() || section == option.section) keys.push_back(ini_key(option));
  }
  throw ConfigError(and_then(where + "unknown key " + describe_key(dotted) + suggestion(key, keys),
                             "The keys are hpc_train --help's option names, with _ for -"));
}

std::string read_file(const std::string& path) {
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored)) {
    throw ConfigError("--config " + path + ": is a directory; give an INI file");
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    throw ConfigError("--config " + path + ": cannot open it (" + std::strerror(errno) +
                      "); check the path");
  }
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) throw ConfigError("--config " + path + ": cannot read it");
  return text.str();
}

// The file's values by "section.key"; every key must be an option under its section.
std::map<std::string, IniValue> read_ini(const std::string& path) {
  const std::string text = read_file(path);
  const std::map<std::string, int> line_of_key = index_ini_lines(text, path);

  po::options_description keys;
  for (const OptionSpec& option : kOptions) {
    keys.add_options()(dotted_key(option).c_str(), po::value<std::string>(), option.help);
  }
  std::istringstream stream(text);
  po::parsed_options parsed(nullptr);
  try {
    parsed = po::parse_config_file(stream, keys, /*allow_unregistered=*/true);
  } catch (const po::error& e) {
    throw ConfigError("--config " + path + ": " + e.what());
  }

  std::map<std::string, IniValue> values;
  for (const po::option& option : parsed.options) {
    const auto line = line_of_key.find(option.string_key);
    const int number = line == line_of_key.end() ? 0 : line->second;
    if (option.unregistered) {
      reject_unknown_key(option.string_key, path + ":" + std::to_string(number) + ": ");
    }
    values[option.string_key] = {option.value.empty() ? "" : option.value.front(), number};
  }
  return values;
}

}  // namespace

CommandLine parse_command_line(int argc, const char* const argv[]) {
  try {
    const TrainConfig defaults;
    const po::options_description options = command_line_options(defaults);
    std::vector<std::string> args;
    for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);

    const po::parsed_options parsed = po::command_line_parser(args)
                                          .options(options)
                                          .style(kCommandLineStyle)
                                          .allow_unregistered()
                                          .run();
    reject_unknown_arguments(parsed);
    po::variables_map given;
    po::store(parsed, given);

    CommandLine result;
    if (given.count("help")) {
      result.action = CommandLine::Action::kPrintAndExit;
      result.text = help_text(options);
      return result;
    }
    if (given.count("version")) {
      result.action = CommandLine::Action::kPrintBuild;  // the libraries' versions: build_info.h
      return result;
    }
    // Note: every option given on the command line is recorded, general ones included, so that
    // a later source of values (the DeepSpeed config) can leave exactly those alone.
    for (const auto& [name, value] : given) {
      if (!value.defaulted()) result.given_on_command_line.insert(name);
    }
    if (given.count("deepspeed-config")) {
      result.deepspeed.path = given["deepspeed-config"].as<std::string>();
      if (result.deepspeed.path.empty()) {
        throw ConfigError(see_help("--deepspeed-config '': give the ds_config.json file"));
      }
    }
    const std::string allow_unknown = given["deepspeed-allow-unknown"].as<std::string>();
    if (!parse_value(allow_unknown, result.deepspeed.allow_unknown_keys).empty()) {
      throw ConfigError(see_help("--deepspeed-allow-unknown=" + allow_unknown +
                                 ": expected true or false, e.g. --deepspeed-allow-unknown"));
    }
    std::map<std::string, IniValue> from_file;
    if (given.count("config")) {
      result.config_file = given["config"].as<std::string>();
      from_file = read_ini(result.config_file);
    }

    for (const OptionSpec& option : kOptions) {
      const std::string shown_default = format_field(defaults, option.field);
      if (on_command_line(given, option.name)) {
        const std::string text = given[option.name].as<std::string>();
        const std::string problem = parse_field(text, result.config, option.field);
        if (problem.empty()) continue;
        const std::string joiner = is_flag(option) ? "=" : " ";
        throw ConfigError(see_help("--" + std::string(option.name) + joiner + text + ": " +
                                   problem + ", e.g. --" + option.name + joiner +
                                   shown_default));
      }
      const auto in_file = from_file.find(dotted_key(option));
      if (in_file == from_file.end()) continue;
      const IniValue& value = in_file->second;
      const std::string problem = parse_field(value.text, result.config, option.field);
      if (problem.empty()) continue;
      const std::string key = ini_key(option);
      throw ConfigError(result.config_file + ":" + std::to_string(value.line) + ": " + key +
                        " = " + value.text + " in [" + option.section + "]: " + problem +
                        ", e.g. " + key + " = " + shown_default);
    }
    return result;
  } catch (const po::error& e) {
    // What Boost still rejects by itself: a missing value, an option given twice.
    throw ConfigError(see_help(e.what()));
  }
}

namespace {

// The range of --bucket-mb and --first-bucket-mb: one byte to 1e6 MiB.
constexpr double kMinBucketMiB = 1.0 / (1 << 20);
constexpr double kMaxBucketMiB = 1e6;
// The range of --data-store-limit-mb: 2^40 MiB (an exbibyte) is no node's memory, and keeps the
// limit in bytes within int64.
constexpr int64_t kMaxDataStoreLimitMiB = int64_t{1} << 40;

// A file name with something before ".safetensors".
bool names_safetensors_file(const std::string& path) {
  const std::string suffix = ".safetensors";
  return path.size() > suffix.size() &&
         path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
}

template <class T>
void require(bool holds, const char* option, const T& value, const std::string& what_works) {
  if (holds) return;
  std::string shown = format_value(value);
  if constexpr (std::is_same_v<T, std::string>) shown = "'" + shown + "'";
  throw ConfigError(std::string("--") + option + " " + shown + ": " + what_works);
}

// --momentum, --dampening and --nesterov: torch.optim.SGD's rules, and only for the rules with
// SGD's momentum buffer (sgd, lars).
void validate_momentum(const TrainConfig& c) {
  const bool momentum_buffer = !keeps_adam_moments(c.optimizer);
  require(std::isfinite(c.momentum) && c.momentum >= 0 && c.momentum < 1, "momentum", c.momentum,
          "must be in [0, 1), e.g. 0.9 (0 = plain SGD)");
  require(c.dampening >= 0 && c.dampening <= 1, "dampening", c.dampening, "must be in [0, 1]");
  const std::string sgd_only =
      "applies to --optimizer sgd and lars only (Adam's and LAMB's momentum is --beta1)";
  require(momentum_buffer || c.momentum == 0, "momentum", c.momentum, sgd_only);
  require(momentum_buffer || c.dampening == 0, "dampening", c.dampening, sgd_only);
  require(momentum_buffer || !c.nesterov, "nesterov", c.nesterov, sgd_only);
  require(!c.nesterov || (c.momentum > 0 && c.dampening == 0), "nesterov", c.nesterov,
          "needs --momentum > 0 and --dampening 0 (torch.optim.SGD's rule)");
}

// The trust ratios' options (Note [Trust ratios] in optimizer.h), each for the one rule that
// reads it: another rule would ignore the value silently.
void validate_trust_ratios(const TrainConfig& c) {
  const TrainConfig defaults;
  const bool lamb = c.optimizer == OptimizerKind::kLamb;
  const bool lars = c.optimizer == OptimizerKind::kLars;
  require(std::isfinite(c.trust_coefficient) && c.trust_coefficient > 0, "trust-coefficient",
          c.trust_coefficient, "must be a finite number > 0, e.g. 0.001");
  require(std::isfinite(c.min_trust_ratio) && c.min_trust_ratio >= 0, "min-trust-ratio",
          c.min_trust_ratio, "must be a finite number >= 0 (0 = no lower bound), e.g. 0.01");
  require(c.max_trust_ratio == 0 ||
              (std::isfinite(c.max_trust_ratio) && c.max_trust_ratio >= c.min_trust_ratio),
          "max-trust-ratio", c.max_trust_ratio,
          "must be 0 (no upper bound) or a finite number >= --min-trust-ratio (" +
              format_value(c.min_trust_ratio) + "), e.g. 10");
  require(lars || c.trust_coefficient == defaults.trust_coefficient, "trust-coefficient",
          c.trust_coefficient, "applies to --optimizer lars only");
  const std::string lamb_only = "applies to --optimizer lamb only";
  require(lamb || c.min_trust_ratio == defaults.min_trust_ratio, "min-trust-ratio",
          c.min_trust_ratio, lamb_only);
  require(lamb || c.max_trust_ratio == defaults.max_trust_ratio, "max-trust-ratio",
          c.max_trust_ratio, lamb_only);
  require(lamb || c.lamb_bias_correction == defaults.lamb_bias_correction,
          "lamb-bias-correction", c.lamb_bias_correction, lamb_only);
}

// The schedules' own options, where the schedule is chosen (LrSchedule checks the resolved ones).
void validate_schedule_shape(const TrainConfig& c) {
  const bool one_cycle = c.lr_schedule == LrScheduleKind::kOneCycle;
  require(c.cycle_min_ratio >= 0 && c.cycle_min_ratio <= 1, "cycle-min-ratio", c.cycle_min_ratio,
          "must be in [0, 1] (a fraction of --lr, the cycle's peak), e.g. 0.1");
  require(c.cycle_first_steps >= 0 && c.cycle_second_steps >= 0 && c.cycle_decay_steps >= 0,
          "cycle-first-steps", c.cycle_first_steps,
          "--cycle-first-steps, --cycle-second-steps and --cycle-decay-steps must be 0 (the "
          "default) or more");
  require(c.cycle_decay_lr_rate >= 0 && c.cycle_decay_momentum_rate >= 0, "cycle-decay-lr-rate",
          c.cycle_decay_lr_rate,
          "--cycle-decay-lr-rate and --cycle-decay-momentum-rate must be >= 0");
  require(c.cycle_min_momentum >= 0 && c.cycle_min_momentum <= c.cycle_max_momentum &&
              c.cycle_max_momentum < 1,
          "cycle-min-momentum", c.cycle_min_momentum,
          "needs 0 <= --cycle-min-momentum <= --cycle-max-momentum (" +
              format_value(c.cycle_max_momentum) + ") < 1");
  require(!one_cycle || !c.cycle_momentum || keeps_adam_moments(c.optimizer) ||
              !c.nesterov || c.cycle_min_momentum > 0,
          "cycle-min-momentum", c.cycle_min_momentum, "must be > 0 with --nesterov");
  require(c.lr_gamma > 0 && c.lr_gamma <= 1, "lr-gamma", c.lr_gamma, "must be in (0, 1], e.g. 0.1");
  const bool multistep = c.lr_schedule == LrScheduleKind::kMultiStep;
  const bool in_steps = !lr_milestone_steps(c.lr_milestones).empty();
  const bool in_epochs = !lr_milestone_epochs(c.lr_milestone_epochs).empty();
  require(multistep || !in_steps, "lr-milestones", c.lr_milestones,
          "applies to --lr-schedule multistep only");
  require(multistep || !in_epochs, "lr-milestone-epochs", c.lr_milestone_epochs,
          "applies to --lr-schedule multistep only");
  require(!multistep || in_steps != in_epochs, "lr-schedule", c.lr_schedule,
          "multistep needs either --lr-milestones (optimizer steps, e.g. 3000,6000) or "
          "--lr-milestone-epochs (epochs, e.g. 30,60,80), not both");
}

// A comma-separated ascending list of integers >= 1, `unit` each, for --`option`.
std::vector<int64_t> ascending_milestones(const std::string& text, const std::string& option,
                                          const std::string& unit, const std::string& example) {
  std::vector<int64_t> values;
  if (text.empty()) return values;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    size_t used = 0;
    int64_t value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || value < 1 || (!values.empty() && value < values.back()))
      throw ConfigError("--" + option + " " + text + ": '" + item + "' is not an " + unit +
                        " >= 1 in ascending order (e.g. " + example + ")");
    values.push_back(value);
  }
  if (static_cast<int>(values.size()) > LrScheduleParams::kMaxMilestones)
    throw ConfigError("--" + option + " " + text + ": at most " +
                      std::to_string(LrScheduleParams::kMaxMilestones) + " milestones");
  return values;
}

}  // namespace

std::vector<int64_t> lr_milestone_steps(const std::string& text) {
  return ascending_milestones(text, "lr-milestones", "optimizer step", "3000,6000");
}

std::vector<int64_t> lr_milestone_epochs(const std::string& text) {
  return ascending_milestones(text, "lr-milestone-epochs", "epoch", "30,60,80");
}

void validate(const TrainConfig& c) {
  require(!c.dataset_path.empty(), "dataset", c.dataset_path,
          "give the HDF5 dataset file (hpc_train_data converts MNIST, CIFAR-10, ...)");
  require(c.prefetch_batches >= 1, "prefetch", c.prefetch_batches,
          "must be at least 1 (batches read ahead)");
  require(c.reader_threads >= kMinReaderThreads && c.reader_threads <= kMaxReaderThreads,
          "reader-threads", c.reader_threads,
          "must be in [" + std::to_string(kMinReaderThreads) + ", " +
              std::to_string(kMaxReaderThreads) + "] (reads in flight a rank; 1 = one at a time)");
  require(c.data_store_limit_mb >= 0 && c.data_store_limit_mb <= kMaxDataStoreLimitMiB,
          "data-store-limit-mb", c.data_store_limit_mb,
          "must be 0 (the node's available memory / its ranks) or a number of MiB up to 2^40");
  // Note [Store and resident data]: both keep the train split in memory, so one run has one:
  // --resident-data on is a contradiction (refused); auto yields to the store.
  require(!(c.data_store == DataStore::kMemory && c.resident_data == Switch::kOn), "data-store",
          c.data_store,
          "cannot be combined with --resident-data on (both keep the train split in memory); "
          "use --resident-data auto or off, or --data-store file");
  require(!c.model.empty(), "model", c.model, "give a model name, e.g. simple_cnn");
  require(c.init_weights.empty() || names_safetensors_file(c.init_weights), "init-weights",
          c.init_weights,
          "must name a .safetensors file (a PyTorch state_dict saved with "
          "safetensors.torch.save_file, or an --export-weights file)");
  require(!c.init_weights_partial || !c.init_weights.empty(), "init-weights-partial",
          c.init_weights_partial, "needs --init-weights FILE.safetensors");
  require(c.epochs >= 1, "epochs", c.epochs, "must be at least 1");
  require(c.max_steps >= 0, "max-steps", c.max_steps, "must be 0 (no limit) or more");
  require(c.cuda_profiler_start_step >= 0, "cuda-profiler-start-step", c.cuda_profiler_start_step,
          "must be 0 (never) or a step number (1 is the first)");
  require(c.cuda_profiler_steps >= 1, "cuda-profiler-steps", c.cuda_profiler_steps,
          "must be at least 1");
  require(c.micro_batch >= 1, "micro-batch", c.micro_batch,
          "must be at least 1 (samples per rank per step)");
  require(c.eval_batch >= 0, "eval-batch", c.eval_batch,
          "must be 0 (sized by the sample) or more (samples per rank per evaluation batch)");
  require(std::isfinite(c.lr) && c.lr > 0, "lr", c.lr, "must be a finite number > 0, e.g. 0.001");
  require(c.beta1 >= 0 && c.beta1 < 1, "beta1", c.beta1, "must be in [0, 1), e.g. 0.9");
  require(c.beta2 >= 0 && c.beta2 < 1, "beta2", c.beta2, "must be in [0, 1), e.g. 0.999");
  require(std::isfinite(c.eps) && c.eps > 0, "eps", c.eps, "must be a finite number > 0, e.g. 1e-8");
  require(std::isfinite(c.weight_decay) && c.weight_decay >= 0, "weight-decay", c.weight_decay,
          "must be a finite number >= 0 (0 turns it off)");
  require(c.grad_accum >= 1, "grad-accum", c.grad_accum,
          "must be at least 1 (micro-steps per optimizer step; 1 = no accumulation)");
  require(std::isfinite(c.clip_grad) && c.clip_grad >= 0, "clip-grad", c.clip_grad,
          "must be a finite number >= 0 (0 turns clipping off), e.g. 1.0");
  require(c.warmup_steps >= 0, "warmup-steps", c.warmup_steps,
          "must be 0 (no warm-up) or more (optimizer steps)");
  require(c.warmup_start_ratio >= 0 && c.warmup_start_ratio <= 1, "warmup-start-ratio",
          c.warmup_start_ratio, "must be in [0, 1] (a fraction of --lr), e.g. 0.1");
  require(c.cosine_final_ratio >= 0 && c.cosine_final_ratio <= 1, "cosine-final-ratio",
          c.cosine_final_ratio, "must be in [0, 1] (a fraction of --lr), e.g. 0.01");
  require(c.schedule_steps >= 0, "schedule-steps", c.schedule_steps,
          "must be 0 (the cosine lasts the whole run) or more (optimizer steps)");
  // A cosine that would end before its warm-up does has no shape; 0 is resolved by the trainer.
  require(c.lr_schedule != LrScheduleKind::kWarmupCosine || c.schedule_steps == 0 ||
              c.schedule_steps >= c.warmup_steps,
          "schedule-steps", c.schedule_steps,
          "the cosine would end before the warm-up (--warmup-steps " +
              std::to_string(c.warmup_steps) + ") does; give at least " +
              std::to_string(c.warmup_steps) + ", or 0 for the whole run");
  require(c.ema_decay >= 0 && c.ema_decay < 1, "ema-decay", c.ema_decay,
          "must be in [0, 1), e.g. 0.999 (0 = no EMA)");
  require(c.label_smoothing >= 0 && c.label_smoothing < 1, "label-smoothing", c.label_smoothing,
          "must be in [0, 1), e.g. 0.1 (0 = none)");
  validate_momentum(c);
  validate_trust_ratios(c);
  validate_schedule_shape(c);
  require(c.zero_stage >= 0 && c.zero_stage <= 2, "zero-stage", c.zero_stage,
          "must be 0, 1 or 2 (stage 3, which partitions the parameters too, is not supported)");
  require(std::isfinite(c.loss_scale) && c.loss_scale >= 0, "loss-scale", c.loss_scale,
          "must be 0 (dynamic) or a fixed scale > 0, e.g. 1024");
  require(c.initial_scale_power >= 0 && c.initial_scale_power <= 64, "initial-scale-power",
          c.initial_scale_power, "must be in [0, 64] (the scale starts at 2^N), e.g. 16");
  require(c.loss_scale_window >= 1, "loss-scale-window", c.loss_scale_window,
          "must be at least 1 (steps without overflow before the scale doubles), e.g. 1000");
  require(c.hysteresis >= 1, "hysteresis", c.hysteresis,
          "must be at least 1 (1 halves the scale at every overflow), e.g. 2");
  require(std::isfinite(c.min_loss_scale) && c.min_loss_scale > 0, "min-loss-scale",
          c.min_loss_scale, "must be a finite number > 0, e.g. 1");
  // The dynamic scale starts at 2^initial_scale_power and never goes below the minimum: a
  // minimum above the start would be a scale that the first overflow raises instead of halving.
  const double initial_scale = std::ldexp(1.0, c.initial_scale_power);
  require(c.loss_scale > 0 || c.min_loss_scale <= initial_scale, "min-loss-scale",
          c.min_loss_scale,
          "must not exceed the dynamic loss scale's start, 2^" +
              std::to_string(c.initial_scale_power) + " = " + format_value(initial_scale) +
              " (--initial-scale-power); give at most " + format_value(initial_scale) +
              " or a larger --initial-scale-power");
  // Bucket caps become whole bytes: below one byte (2^-20 MiB) a cap is 0 bytes, which no
  // gradient fits; above kMaxBucketMiB (about 1 TB) the size is a typo, not a bucket.
  require(c.bucket_mb == 0.0 || (c.bucket_mb >= kMinBucketMiB && c.bucket_mb <= kMaxBucketMiB),
          "bucket-mb", c.bucket_mb,
          "must be 0 (chosen by the ZeRO stage) or a number of MiB from 2^-20 (one byte) to 1e6, "
          "e.g. 25");
  require(c.first_bucket_mb >= kMinBucketMiB && c.first_bucket_mb <= kMaxBucketMiB,
          "first-bucket-mb", c.first_bucket_mb,
          "must be a number of MiB from 2^-20 (one byte) to 1e6, e.g. 1");
  require(c.threads_per_rank >= 0, "threads-per-rank", c.threads_per_rank,
          "must be 0 (the node's cores / ranks) or more");
  require(std::isfinite(c.comm_timeout_s) && c.comm_timeout_s >= 0, "comm-timeout",
          c.comm_timeout_s, "must be 0 (no limit) or a number of seconds, e.g. 300");
  require(!(c.deterministic && c.cudnn_benchmark), "cudnn-benchmark", c.cudnn_benchmark,
          "cannot be combined with --deterministic (autotuning picks algorithms by timing)");
  require(c.checkpoint_every >= 0, "checkpoint-every", c.checkpoint_every,
          "must be 0 (off) or a number of steps");
  require(std::isfinite(c.checkpoint_every_minutes) && c.checkpoint_every_minutes >= 0,
          "checkpoint-every-minutes", c.checkpoint_every_minutes,
          "must be 0 (off) or a finite number of minutes > 0, e.g. 30");
  require(c.keep_checkpoints >= 0, "keep-checkpoints", c.keep_checkpoints,
          "must be 0 (keep all) or more");
  require(c.export_weights.empty() || (c.export_weights.size() > 12 &&
                                       c.export_weights.substr(c.export_weights.size() - 12) ==
                                           ".safetensors"),
          "export-weights", c.export_weights, "must name a file ending in .safetensors");
  require(c.log_every >= 1, "log-every", c.log_every, "must be at least 1 (steps)");
  // A job name is one folder under the output path: empty, it would write into the output
  // path itself (the run directory, beside the checkpoints).
  require(!c.tensorboard_job_name.empty(), "tensorboard-job-name", c.tensorboard_job_name,
          "give a folder name, e.g. tensorboard");
  require(!c.csv_monitor_job_name.empty(), "csv-monitor-job-name", c.csv_monitor_job_name,
          "give a folder name, e.g. csv_monitor");
}

std::string monitor_directory(const std::string& output_path, const std::string& job_name,
                              const std::string& run_dir) {
  return (output_path.empty() ? run_dir : output_path) + "/" + job_name;
}

// Note [Rank's share of the train split]: every rank gets the same number of samples an epoch
// (epoch_plan.h): ceil(N / W), the permutation's head repeated as padding, or with --drop-last
// floor(N / W). --drop-last drops only the N mod W samples that the ranks cannot share evenly,
// never a partial micro-batch: a rank's last micro-batch of an epoch is partial whenever its
// share is not a multiple of --micro-batch. So with a micro-batch larger than the share, every
// micro-batch of the run would be partial: no step would have the global batch that the run
// reports (micro-batch x grad-accum x ranks), that a DeepSpeed config fixes and that the
// learning rate was tuned for. Such a micro-batch is refused; one equal to the share is fine
// (one full micro-batch a rank and epoch). With --drop-last and fewer samples than ranks the
// share is 0, and no micro-batch fits.
//
// Note [Input memory bound]: the least host memory that a run's input takes: the loader's queue
// (--prefetch micro-batches, at most an epoch's) and the micro-batch being read, as uint8
// images, and the model's input made from one of them, as float32 (4 bytes an element); the
// staging buffers of the device input and the activations come on top. When that alone is
// more than the node has, the run could only end in an allocation failure or the kernel's OOM
// killer once training had started, so it is refused before anything is allocated. Likewise
// an --eval-batch given outright (evaluation reads the test split the same way, in its own
// batches), and a train split kept resident in host memory (--resident-data on, on the CPU).
void validate_for_dataset(const TrainConfig& c, const DatasetInfo& dataset,
                          const std::string& dataset_path, int world_size,
                          int64_t host_memory_bytes, bool input_on_host) {
  // Note [Rank's share of the train split]
  const int64_t n = dataset.train_size;
  const EpochTail tail = c.drop_last ? EpochTail::kDrop : EpochTail::kPad;
  const int64_t share = samples_for_rank(n, world_size, 0, tail);  // the same on every rank
  const std::string split = "the train split of " + dataset_path + " (" + std::to_string(n) +
                            " samples)";
  if (share == 0)
    throw ConfigError("--drop-last: " + split + " has fewer samples than the " +
                      std::to_string(world_size) +
                      " ranks, so dropping the tail that the ranks cannot share evenly leaves "
                      "every rank none; use fewer ranks, or leave out --drop-last");
  if (c.micro_batch > share) {
    const int64_t padded = share * world_size - n;  // > 0: repeated; < 0: dropped
    const std::string how =
        padded > 0   ? ", padded by repeating " + std::to_string(padded) + " of them"
        : padded < 0 ? ", --drop-last drops the other " + std::to_string(-padded)
                     : "";
    throw ConfigError("--micro-batch " + std::to_string(c.micro_batch) +
                      ": more than each rank's share of " + split + ": " +
                      std::to_string(world_size) + " ranks get " + std::to_string(share) +
                      " samples each" + how +
                      ", so every micro-batch would be partial and no step would have the "
                      "global batch of micro-batch x grad-accum x ranks; use --micro-batch " +
                      std::to_string(share) + " or less, or fewer ranks");
  }

  // Note [Input memory bound]; in double, which cannot overflow here and is exact enough for a
  // bound.
  const double sample_bytes = static_cast<double>(dataset.sample_bytes());
  const double memory = static_cast<double>(host_memory_bytes);
  const std::string shape = dataset.sample_shape();
  // Per sample of a batch of `batch` from a rank's `rank_share` of a split: the loader's queue
  // (at most the share's batches), the batch being read and its float32 copy.
  const auto per_sample_bytes = [&](int64_t batch, int64_t rank_share) {
    const double queued = static_cast<double>(
        std::min<int64_t>(c.prefetch_batches, batches_per_epoch(rank_share, batch)));
    return sample_bytes * (queued + 1 + sizeof(float));
  };
  if (per_sample_bytes(c.micro_batch, share) > memory)
    throw DataError(dataset_path + ": one sample of " + shape + " (channels x height x width) "
                    "is " + memory_text(sample_bytes) + "; the input of a micro-batch of 1 needs "
                    "at least " + memory_text(per_sample_bytes(c.micro_batch, share)) +
                    " of host memory, more than this node's " + memory_text(memory));
  const auto require_batch_fits = [&](const char* option, int64_t batch, int64_t rank_share,
                                      const std::string& remedy) {
    // No batch is larger than the share.
    const double bytes = per_sample_bytes(batch, rank_share) *
                         static_cast<double>(std::min(batch, rank_share));
    if (bytes > memory)
      throw ConfigError(std::string("--") + option + " " + std::to_string(batch) +
                        ": the input of a batch of " + dataset_path + "'s " + shape +
                        " samples (" + memory_text(sample_bytes) + " each) needs at least " +
                        memory_text(bytes) + " of host memory (the loader's queue, the batch "
                        "being read and its float32 copy), more than this node's " +
                        memory_text(memory) + "; " + remedy);
  };
  require_batch_fits("micro-batch", c.micro_batch, share,
                     "use a smaller --micro-batch or --prefetch");
  // An --eval-batch given outright; auto takes at most 16 MiB of float32 input, or 256 samples
  // (run_options.h evaluation_batch).
  if (c.eval_batch > 0)
    require_batch_fits("eval-batch", c.eval_batch,
                       largest_evaluation_share(dataset.test_size, world_size),
                       "use a smaller --eval-batch or --prefetch, or 0 (sized by the sample)");
  if (input_on_host && c.resident_data == Switch::kOn) {
    const double split_bytes = static_cast<double>(n) * (sample_bytes + sizeof(int64_t));
    if (split_bytes > memory)
      throw ConfigError("--resident-data on: " + split + " of " + shape + " images needs " +
                        memory_text(split_bytes) + " of host memory to stay resident (this run "
                        "computes on the CPU), more than this node's " + memory_text(memory) +
                        "; use --resident-data off");
  }
}

bool resumes_newest_checkpoint(const TrainConfig& config) { return config.resume == "auto"; }

// Note: Boost's INI parser has no escapes, so a string value with '#' (a comment there) or with
// blanks at either end does not read back; the command line still accepts such values.
std::string to_ini(const TrainConfig& config) {
  std::string text = "# hpc_train resolved configuration\n";
  for (const SectionSpec& section : kSections) {
    text += std::string("\n[") + section.name + "]\n";
    for (const OptionSpec& option : kOptions) {
      if (std::string_view(option.section) != section.name) continue;
      text += ini_key(option) + " = " + format_field(config, option.field) + "\n";
    }
  }
  return text;
}

}  // namespace hpc_train

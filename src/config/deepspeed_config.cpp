// DeepSpeed's ds_config.json mapped onto TrainConfig (deepspeed_config.h). configs/README.md has
// the table of keys for users; this file is the mapping itself.
//
// Note [DeepSpeed config precedence]: command line > ds_config.json > INI file > defaults.
//  - An option named in given_on_command_line is never changed here; a file value that differs
//    from it gives a warning, so nobody wonders which one ran.
//  - A key in the file overrides the INI file and the defaults.
//  - A block present in the file describes that part of the training the way DeepSpeed would run
//    it, DeepSpeed's defaults included, so that the file means here what it meant there:
//    optimizer.params (FusedAdam's lr 1e-3, betas (0.9, 0.999), eps 1e-8 and weight_decay 0 --
//    hpc_train's own default weight decay is 0.01), fp16 (enabled false and the loss scaler's
//    defaults), bf16 (enabled false; with an fp16 or bf16 block and neither enabled, the
//    precision is fp32) and scheduler.params. Keys absent from zero_optimization keep
//    hpc_train's values: they only move time and memory, never the result (DESIGN.md: ZeRO stages
//    give the same parameters), and hpc_train's bucket and overlap defaults suit it better than
//    DeepSpeed's 5e8-element buckets. Absent top-level keys keep hpc_train's values too.
//
// Note [Keys hpc_train does not implement]: a key that only changes how a run is watched, how
// fast it goes or how much memory it takes (wandb, comet, flops_profiler,
// activation_checkpointing, zero_optimization.sub_group_size, ...) is ignored with a warning that
// names it, so that a ds_config.json made for DeepSpeed runs here as it is. A key that would
// change what the run computes if it were ignored stays an error (kMathTopLevelKeys, and any
// unknown key inside optimizer, scheduler, fp16 and bf16, which parameterise the update), as does
// an unknown top-level key within two edits of a known one (a misspelt train_batch_size must not
// fall back to another batch silently). --deepspeed-allow-unknown turns those errors into
// warnings too.
//
// Note ["auto" values]: Hugging Face's DeepSpeed templates write "auto" for values that its
// Trainer fills in. Here "auto" means "not set by this file": the command line, INI file or
// default decides, as for a key left out of the top level (even inside a block, where a left-out
// key means DeepSpeed's default), and a line on rank 0 names the value it resolved to.
//
// Note [Batch identity]: DeepSpeed requires train_batch_size = train_micro_batch_size_per_gpu x
// gradient_accumulation_steps x world size, and derives the one or two values the file leaves out
// (_set_batch_related_parameters, then _batch_assertion), with integer division, so a
// train_batch_size that the world size does not divide fails the check instead of being rounded
// silently. The same rules apply here, with one extension: a micro-batch or grad_accum given on
// the command line counts as given in the file, and when the file gives neither
// train_batch_size nor the micro-batch (DeepSpeed would stop), the micro-batch and grad_accum of
// the command line, INI file or defaults are used, and a warning says so.
#include "hpc_train/config/deepspeed_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "config/edit_distance.h"
#include "hpc_train/error.h"

namespace hpc_train {
namespace {

using json = nlohmann::json;

constexpr double kBytesPerMiB = 1024.0 * 1024.0;

// DeepSpeed's defaults for what a block present in the file leaves out (Note [DeepSpeed config
// precedence]). FusedAdam's and DeepSpeedCPUAdam's weight decay is 0; torch.optim.AdamW's, which
// DeepSpeed uses with params.torch_adam, is 0.01.
constexpr double kDsAdamLr = 1e-3;
constexpr double kDsAdamBeta1 = 0.9;
constexpr double kDsAdamBeta2 = 0.999;
constexpr double kDsAdamEps = 1e-8;
constexpr double kDsFusedAdamWeightDecay = 0.0;
constexpr double kDsTorchAdamWWeightDecay = 0.01;
constexpr double kDsLossScale = 0.0;  // dynamic
constexpr int kDsInitialScalePower = 16;
constexpr int kDsLossScaleWindow = 1000;
constexpr int kDsHysteresis = 2;
constexpr double kDsMinLossScale = 1.0;
constexpr int64_t kDsWarmupNumSteps = 1000;
constexpr const char* kDsWarmupType = "log";
constexpr double kDsWarmupMinLr = 0.0;
constexpr double kDsWarmupMinRatio = 0.0;
constexpr double kDsCosMinRatio = 0.0001;
// OneCycle's keyword defaults; its cycle_min_lr and cycle_max_lr have none.
constexpr int64_t kDsCycleFirstStepSize = 2000;
constexpr double kDsCycleMinMom = 0.8;
constexpr double kDsCycleMaxMom = 0.9;
// DeepSpeed's OneCycle sets Adam's betas to (cycled momentum, 0.99) while it cycles.
constexpr double kDsOneCycleBeta2 = 0.99;
// torch.optim.SGD's defaults (DeepSpeed builds an optimizer it does not know by its torch name).
constexpr double kDsSgdLr = 1e-3;
// FusedLamb's bounds of the trust ratio; its lr, betas, eps and weight decay default as
// FusedAdam's.
constexpr double kDsLambMaxCoeff = 10.0;
constexpr double kDsLambMinCoeff = 0.01;
// DeepSpeed's warm-up divides by log(warmup_num_steps), so it lengthens shorter ones to 2 steps.
constexpr int64_t kDsMinWarmupNumSteps = 2;

// Top-level keys that change nothing a run computes, accepted with a warning that says why.
const std::pair<const char*, const char*> kIgnoredTopLevelKeys[] = {
    {"wall_clock_breakdown",
     "hpc_train always records the step-time breakdown (metrics.jsonl)"},
    {"memory_breakdown", "DeepSpeed's memory printout; hpc_train records GPU memory in metrics"},
    {"dump_state", "DeepSpeed's printout of its state at start-up"},
    {"zero_allow_untested_optimizer",
     "it only lets DeepSpeed's ZeRO take a client optimizer; hpc_train runs its own Adam/AdamW"},
};

// Top-level keys that would change what the run computes if they were ignored: an error (Note
// [Keys hpc_train does not implement]), unless the value is the one that changes nothing
// (`harmless`, compared as JSON) or a block with "enabled": false.
struct MathKey {
  const char* key;
  const char* harmless;  // JSON text; nullptr = only a disabled block
  const char* why;
};
const MathKey kMathTopLevelKeys[] = {
    {"amp", nullptr,
     "NVIDIA Apex AMP changes the arithmetic's precision; use \"fp16\" or \"bf16\""},
    {"torch_autocast", nullptr,
     "autocast changes the arithmetic's precision; use \"fp16\" or \"bf16\" (the model's dtype)"},
    {"bfloat16", nullptr, "older DeepSpeed's name for \"bf16\"; write \"bf16\""},
    {"prescale_gradients", "false", "dividing before the reduction changes fp16 rounding"},
    {"gradient_predivide_factor", "1.0", "dividing before the reduction changes fp16 rounding"},
    {"sparse_gradients", "false", "hpc_train reduces every gradient densely"},
    {"elasticity", nullptr, "elastic training changes the batch size with the world size"},
    {"curriculum_learning", nullptr, "a curriculum changes the data each step sees"},
    {"data_efficiency", nullptr, "data sampling and routing change the data each step sees"},
    {"progressive_layer_drop", nullptr, "dropping layers changes the model"},
    {"compression_training", nullptr, "compression changes the weights"},
    {"quantize_training", nullptr, "quantization changes the weights"},
};

// Blocks hpc_train does not implement that are about watching a run: a warning says what to use.
const std::pair<const char*, const char*> kUnimplementedMonitors[] = {
    {"wandb", "Weights & Biases is not available here (no network on compute nodes, no new "
              "dependency); hpc_train writes TensorBoard event files (--tensorboard) and "
              "DeepSpeed's CSV files (--csv-monitor), which W&B can import"},
    {"comet", "Comet is not available here; hpc_train writes TensorBoard event files "
              "(--tensorboard) and DeepSpeed's CSV files (--csv-monitor)"},
};

bool is_auto(const json& value) { return value.is_string() && value.get<std::string>() == "auto"; }

std::string join(const std::vector<std::string>& words, const char* separator) {
  std::string text;
  for (const std::string& word : words) text += (text.empty() ? "" : separator) + word;
  return text;
}

// "1, 2 or 4"
std::string join_or(const std::vector<int64_t>& values) {
  std::vector<std::string> words;
  for (const int64_t value : values) words.push_back(std::to_string(value));
  return or_list(words);
}

std::string show(const std::string& value) { return value; }
std::string show(bool value) { return value ? "true" : "false"; }
std::string show(int value) { return std::to_string(value); }
std::string show(int64_t value) { return std::to_string(value); }
// nlohmann prints the shortest text that reads back to the same double.
std::string show(double value) { return json(value).dump(); }
template <class Choice, std::enable_if_t<is_choice_v<Choice>, int> = 0>
std::string show(Choice value) {
  return to_string(value);
}

std::string ranks(int64_t count) {
  return std::to_string(count) + (count == 1 ? " rank" : " ranks");
}

// "1, 2 or 4 ranks", "1 rank"
std::string ranks(const std::vector<int64_t>& counts) {
  return join_or(counts) + (counts.size() == 1 && counts[0] == 1 ? " rank" : " ranks");
}

// The file, with a key given twice reported (DeepSpeed rejects that too; nlohmann would keep the
// last silently).
json parse_file(const std::string& path) {
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored)) {
    throw ConfigError("--deepspeed-config " + path +
                      ": is a directory; give the ds_config.json file");
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    throw ConfigError("--deepspeed-config " + path + ": cannot open it (" + std::strerror(errno) +
                      "); check the path");
  }
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) throw ConfigError("--deepspeed-config " + path + ": cannot read it");

  // The keys seen in each open object, and the dotted path to it, to name a duplicate.
  struct Frame {
    bool is_object;
    std::vector<std::string> keys;
  };
  std::vector<Frame> frames;
  std::string duplicate;
  constexpr int kMaxJsonDepth = 128;  // arrays and objects inside each other
  const auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        // The messages quote a wrong value with dump(), which recurses: 100,000 nested brackets
        // overflowed the stack (found by fuzz/fuzz_deepspeed_config.cpp). DeepSpeed's keys nest
        // 4 levels; Python's json stops near 1,000.
        if (depth >= kMaxJsonDepth) {
          throw ConfigError(path + ": arrays and objects nested more than " +
                            std::to_string(kMaxJsonDepth) + " levels deep; DeepSpeed's keys need 4");
        }
        frames.push_back({event == json::parse_event_t::object_start, {}});
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!frames.empty()) frames.pop_back();
        break;
      case json::parse_event_t::key: {
        if (frames.empty() || !duplicate.empty()) break;
        const std::string key = parsed.get<std::string>();
        std::vector<std::string>& keys = frames.back().keys;
        if (std::find(keys.begin(), keys.end(), key) != keys.end()) {
          std::string dotted;
          for (size_t i = 0; i + 1 < frames.size(); ++i) {
            dotted += frames[i].is_object && !frames[i].keys.empty() ? frames[i].keys.back() + "."
                                                                     : std::string("[].");
          }
          duplicate = dotted + key;
        }
        keys.push_back(key);
        break;
      }
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  json root;
  try {
    root = json::parse(text.str(), on_event);
  } catch (const json::parse_error& e) {
    throw ConfigError(path + ": not valid JSON (byte " + std::to_string(e.byte) + "): " + e.what());
  } catch (const json::out_of_range& e) {
    // What nlohmann throws for a number beyond a double's range (1e400); it escaped as exit 1.
    throw ConfigError(path + ": not valid JSON: " + e.what());
  }
  if (!duplicate.empty()) {
    throw ConfigError(path + ": key '" + duplicate +
                      "' appears twice; keep one (DeepSpeed rejects duplicate keys too)");
  }
  if (!root.is_object()) {
    throw ConfigError(path + ": the top level must be a JSON object ({...}), not " +
                      root.type_name());
  }
  return root;
}

const json* member(const json& object, const char* name) {
  const auto found = object.find(name);
  return found == object.end() ? nullptr : &*found;
}

class Importer {
 public:
  Importer(const DeepSpeedImport& import, int world_size, const std::set<std::string>& given,
           TrainConfig& config)
      : path_(import.path),
        allow_unknown_(import.allow_unknown_keys),
        world_size_(world_size),
        given_(given),
        config_(config) {}

  std::vector<std::string> run() {
    const json root = parse_file(path_);
    check_top_level_keys(root);
    // Precision first, then the gradients' dtypes (relative to it): the bucket size in
    // zero_optimization is counted in elements of the dtype that the collectives move.
    apply_precision(root);
    apply_gradient_dtypes(root);
    if (const json* block = member(root, "optimizer")) apply_optimizer(*block);
    // After the optimizer: WarmupLR's warmup_max_lr replaces the optimizer's lr, as in DeepSpeed.
    if (const json* block = member(root, "scheduler")) apply_scheduler(*block, root);
    if (const json* block = member(root, "zero_optimization")) apply_zero(*block);
    if (const json* value = member(root, "gradient_clipping");
        value && !left_to_us(*value, "gradient_clipping", "clip-grad", &TrainConfig::clip_grad)) {
      set("clip-grad", "gradient_clipping", &TrainConfig::clip_grad,
          number(*value, "gradient_clipping"));
    }
    if (const json* value = member(root, "steps_per_print");
        value && !left_to_us(*value, "steps_per_print", "log-every", &TrainConfig::log_every)) {
      set("log-every", "steps_per_print", &TrainConfig::log_every,
          to_int(whole(*value, "steps_per_print"), "steps_per_print"));
    }
    apply_batch(root);
    warn_unused_gradient_dtypes();
    if (const json* block = member(root, "tensorboard")) {
      apply_monitor(*block, "tensorboard", "tensorboard", &TrainConfig::tensorboard,
                    &TrainConfig::tensorboard_output_path, &TrainConfig::tensorboard_job_name);
    }
    if (const json* block = member(root, "csv_monitor")) {
      apply_monitor(*block, "csv_monitor", "csv-monitor", &TrainConfig::csv_monitor,
                    &TrainConfig::csv_monitor_output_path, &TrainConfig::csv_monitor_job_name);
    }
    validate_mapped();
    // Note ["auto" values]: what each "auto" resolved to, once everything is applied.
    for (const auto& [key, resolved] : auto_keys_) warn("'" + key + "' is \"auto\": " + resolved());
    return std::move(warnings_);
  }

 private:
  std::string where() const { return path_ + ": "; }
  void warn(const std::string& message) { warnings_.push_back(where() + message); }

  // --- Keys (Note [Keys hpc_train does not implement]).

  // How an unknown key inside a block is met: an error, or (a block whose keys only move time
  // and memory, or only watch the run) a warning.
  enum class Unknown { kError, kWarn };

  void ignored_key(const std::string& key, const std::string& why) {
    warn("'" + key + "' is not implemented by hpc_train and is ignored" +
         (why.empty() ? "" : ": " + why));
  }

  void unknown_key(const std::string& key, const std::vector<std::string>& known) {
    if (allow_unknown_) {
      warn("ignoring unknown key '" + key + "' (--deepspeed-allow-unknown); known keys here: " +
           join(known, ", "));
      return;
    }
    throw ConfigError(where() + "unknown key '" + key + "'; known keys here: " +
                      join(known, ", ") +
                      ". --deepspeed-allow-unknown turns this into a warning");
  }

  void check_keys(const json& object, const std::string& prefix,
                  const std::vector<std::string>& known, Unknown unknown = Unknown::kError) {
    for (const auto& item : object.items()) {
      if (std::find(known.begin(), known.end(), item.key()) != known.end()) continue;
      const std::string key = prefix.empty() ? item.key() : prefix + "." + item.key();
      if (unknown == Unknown::kWarn) {
        ignored_key(key, "");
      } else {
        unknown_key(key, known);
      }
    }
  }

  // A block given as {"enabled": false} changes nothing, whatever it would do enabled.
  static bool disabled_block(const json& value) {
    const json* enabled = value.is_object() ? member(value, "enabled") : nullptr;
    return enabled && enabled->is_boolean() && !enabled->get<bool>();
  }

  void check_top_level_keys(const json& root) {
    std::vector<std::string> known = {
        "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
        "optimizer",        "scheduler",                      "fp16",
        "bf16",             "data_types",                     "communication_data_type",
        "zero_optimization", "gradient_clipping",             "steps_per_print",
        "tensorboard",      "csv_monitor"};
    for (const auto& [key, reason] : kIgnoredTopLevelKeys) known.emplace_back(key);
    for (const auto& [key, reason] : kUnimplementedMonitors) known.emplace_back(key);
    for (const auto& item : root.items()) {
      const std::string& key = item.key();
      if (std::find(known.begin(), known.end(), key) != known.end()) {
        for (const auto& [ignored, reason] : kIgnoredTopLevelKeys) {
          if (key == ignored) warn("'" + key + "' is ignored: " + reason);
        }
        for (const auto& [monitor, reason] : kUnimplementedMonitors) {
          if (key == monitor) ignored_key(key, reason);
        }
        continue;
      }
      const MathKey* math = nullptr;
      for (const MathKey& candidate : kMathTopLevelKeys) {
        if (key == candidate.key) math = &candidate;
      }
      if (math) {
        const bool harmless = disabled_block(item.value()) ||
                              (math->harmless && item.value() == json::parse(math->harmless));
        if (harmless) {
          ignored_key(key, "its value changes nothing");
        } else if (allow_unknown_) {
          warn("ignoring '" + key + "' (--deepspeed-allow-unknown), which changes the result: " +
               math->why);
        } else {
          throw ConfigError(where() + "'" + key + "' is not supported and would change what the " +
                            "run computes if it were ignored: " + math->why +
                            ". Remove it (--deepspeed-allow-unknown ignores it anyway)");
        }
        continue;
      }
      // A misspelt known key: ignoring it would silently run with another value.
      const bool misspelt =
          key.size() > 4 && std::any_of(known.begin(), known.end(), [&](const std::string& k) {
            return edit_distance(key, k) <= 2;
          });
      if (misspelt) {
        unknown_key(key, known);
      } else {
        ignored_key(key, "");
      }
    }
  }

  // --- Note ["auto" values]

  // Whether `value` is "auto"; if so, the option keeps its value and the end of the import names
  // it. `field` is the option the key would set.
  template <class T>
  bool left_to_us(const json& value, const std::string& key, const std::string& option,
                  T TrainConfig::*field) {
    if (!is_auto(value)) return false;
    auto_keys_.emplace_back(key, [this, option, field] {
      return "--" + option + " " + show(config_.*field) +
             (given_.count(option) ? " (the command line)" : " (the INI file or default)");
    });
    return true;
  }

  // "auto" for a key that sets nothing here (an accepted no-op).
  bool auto_no_op(const json& value, const std::string& key) {
    if (!is_auto(value)) return false;
    auto_keys_.emplace_back(key,
                            [] { return std::string("nothing to set (accepted, no effect)"); });
    return true;
  }

  // --- Monitors: DeepSpeed's tensorboard and csv_monitor blocks. Keys left out keep hpc_train's
  // values (TensorBoard on in <run dir>/tensorboard); unknown keys only watch the run.
  void apply_monitor(const json& value, const std::string& name, const char* option,
                     bool TrainConfig::*enabled_field, std::string TrainConfig::*path_field,
                     std::string TrainConfig::*job_field) {
    const json& block = object(value, name);
    check_keys(block, name, {"enabled", "output_path", "job_name"}, Unknown::kWarn);
    const std::string path_option = std::string(option) + "-output-path";
    const std::string job_option = std::string(option) + "-job-name";
    const char* path_name = path_option.c_str();
    const char* job_name = job_option.c_str();
    if (const json* enabled = member(block, "enabled");
        enabled && !left_to_us(*enabled, name + ".enabled", option, enabled_field)) {
      set(option, name + ".enabled", enabled_field, boolean(*enabled, name + ".enabled"));
    }
    if (const json* path = member(block, "output_path");
        path && !left_to_us(*path, name + ".output_path", path_name, path_field)) {
      set(path_name, name + ".output_path", path_field, text(*path, name + ".output_path"));
    }
    if (const json* job = member(block, "job_name");
        job && !left_to_us(*job, name + ".job_name", job_name, job_field)) {
      set(job_name, name + ".job_name", job_field, text(*job, name + ".job_name"));
    }
  }

  // --- Values of the expected JSON type, or a ConfigError naming key, expectation and value.

  [[noreturn]] void wrong_type(const std::string& key, const std::string& expected,
                               const json& value) const {
    std::string shown = value.dump();
    if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
    std::string message = where() + "'" + key + "' must be " + expected + ", not " +
                          value.type_name() + " " + shown;
    if (is_auto(value)) {
      message += " (\"auto\" is taken for the values that hpc_train has an option for, not "
                 "here; give the value itself)";
    }
    throw ConfigError(message);
  }

  int64_t whole(const json& value, const std::string& key) const {
    if (value.is_number_unsigned()) {
      if (value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return value.get<int64_t>();
      }
    } else if (value.is_number_integer()) {
      return value.get<int64_t>();
    } else if (value.is_number_float()) {
      // Python writes 5e8 as a float, and DeepSpeed (pydantic) takes a float without a fraction
      // where it wants a whole number, so 5e8 and 64.0 are whole numbers here too.
      const double number = value.get<double>();
      if (std::isfinite(number) && number == std::floor(number) && std::fabs(number) < 9.0e18) {
        return static_cast<int64_t>(number);
      }
    }
    wrong_type(key, "a whole number", value);
  }

  int to_int(int64_t value, const std::string& key) const {
    if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) {
      throw ConfigError(where() + "'" + key + "' " + std::to_string(value) +
                        " is out of range (at most " +
                        std::to_string(std::numeric_limits<int>::max()) + ")");
    }
    return static_cast<int>(value);
  }

  double number(const json& value, const std::string& key) const {
    if (!value.is_number()) wrong_type(key, "a number", value);
    return value.get<double>();
  }

  bool boolean(const json& value, const std::string& key) const {
    if (!value.is_boolean()) wrong_type(key, "true or false", value);
    return value.get<bool>();
  }

  std::string text(const json& value, const std::string& key) const {
    if (!value.is_string()) wrong_type(key, "a string", value);
    return value.get<std::string>();
  }

  const json& object(const json& value, const std::string& key) const {
    if (!value.is_object()) wrong_type(key, "an object {...}", value);
    return value;
  }

  // --- Setting an option, unless the command line gave it (Note [DeepSpeed config precedence]).

  // `in_file` is false for DeepSpeed's default of a key the file leaves out of a block it has.
  template <class T>
  void set(const char* option, const std::string& key, T TrainConfig::*field, const T& value,
           bool in_file = true) {
    if (given_.count(option)) {
      if (in_file && !(config_.*field == value)) {
        warn("'" + key + "' " + show(value) + " is not used: --" + option + " " +
             show(config_.*field) + " on the command line wins");
      }
      return;
    }
    config_.*field = value;
    source_of_option_[option] = in_file ? "'" + key + "'"
                                        : "'" + key + "' (left out: DeepSpeed's default)";
  }

  // --- The blocks.

  void apply_precision(const json& root) {
    const json* fp16 = member(root, "fp16");
    const json* bf16 = member(root, "bf16");
    if (!fp16 && !bf16) return;
    bool fp16_enabled = false;
    bool bf16_enabled = false;
    bool enabled_in_file = false;
    bool enabled_auto = false;  // an "enabled": "auto": the precision is not this file's to set
    std::vector<std::string> scaler_keys_given;
    if (fp16) {
      const json& block = object(*fp16, "fp16");
      check_keys(block, "fp16",
                 {"enabled", "auto_cast", "loss_scale", "initial_scale_power",
                  "loss_scale_window", "hysteresis", "consecutive_hysteresis",
                  "min_loss_scale"});
      if (const json* value = member(block, "enabled")) {
        if (left_to_us(*value, "fp16.enabled", "precision", &TrainConfig::precision)) {
          enabled_auto = true;
        } else {
          fp16_enabled = boolean(*value, "fp16.enabled");
          enabled_in_file = true;
        }
      }
      // auto_cast casts the model's inputs to fp16; hpc_train always casts a batch to the model
      // dtype on the device, so either value is what happens here.
      if (const json* value = member(block, "auto_cast");
          value && !auto_no_op(*value, "fp16.auto_cast")) {
        boolean(*value, "fp16.auto_cast");
      }
      if (const json* value = member(block, "consecutive_hysteresis");
          value && !auto_no_op(*value, "fp16.consecutive_hysteresis")) {
        if (boolean(*value, "fp16.consecutive_hysteresis")) {
          throw ConfigError(where() +
                            "'fp16.consecutive_hysteresis' true is not supported: hpc_train's "
                            "loss scaler refills the hysteresis only when the scale grows "
                            "(DeepSpeed's default); remove the key or set it to false");
        }
      }
      for (const char* key : {"loss_scale", "initial_scale_power", "loss_scale_window",
                              "hysteresis", "min_loss_scale"}) {
        if (member(block, key)) scaler_keys_given.push_back(std::string("fp16.") + key);
      }
      set_number(block, "fp16", "loss_scale", "loss-scale", &TrainConfig::loss_scale,
                 kDsLossScale);
      set_int(block, "fp16", "initial_scale_power", "initial-scale-power",
              &TrainConfig::initial_scale_power, kDsInitialScalePower);
      set_int(block, "fp16", "loss_scale_window", "loss-scale-window",
              &TrainConfig::loss_scale_window, kDsLossScaleWindow);
      set_int(block, "fp16", "hysteresis", "hysteresis", &TrainConfig::hysteresis, kDsHysteresis);
      set_number(block, "fp16", "min_loss_scale", "min-loss-scale", &TrainConfig::min_loss_scale,
                 kDsMinLossScale);
    }
    if (bf16) {
      const json& block = object(*bf16, "bf16");
      check_keys(block, "bf16", {"enabled"});
      if (const json* value = member(block, "enabled")) {
        if (left_to_us(*value, "bf16.enabled", "precision", &TrainConfig::precision)) {
          enabled_auto = true;
        } else {
          bf16_enabled = boolean(*value, "bf16.enabled");
          enabled_in_file = true;
        }
      }
    }
    if (fp16_enabled && bf16_enabled) {
      throw ConfigError(where() +
                        "fp16.enabled and bf16.enabled are both true; enable one of them (bf16 "
                        "keeps fp32's range and needs no loss scale; fp16 uses the fp16 block's "
                        "loss scaler)");
    }
    const Precision precision = fp16_enabled   ? Precision::kFp16
                                : bf16_enabled ? Precision::kBf16
                                               : Precision::kFp32;
    const char* key = fp16_enabled   ? "fp16.enabled"
                      : bf16_enabled ? "bf16.enabled"
                                     : "fp16/bf16 (neither enabled)";
    // "auto" leaves the precision to the command line, INI file or default, unless the other
    // block enables its own.
    if (!enabled_auto || fp16_enabled || bf16_enabled)
      set("precision", key, &TrainConfig::precision, precision, enabled_in_file);
    if (!scaler_keys_given.empty() && config_.precision != Precision::kFp16) {
      warn(join(scaler_keys_given, ", ") + " take effect only with fp16; the precision is " +
           to_string(config_.precision));
    }
  }

  // --- The gradients' dtypes (Note [Gradient precision] in flat_parameters.h).
  //
  // DeepSpeed names a dtype with DtypeEnum's names in data_types.grad_accum_dtype ("fp32",
  // "float32", "float", "torch.float32", ...; as written) and with "fp32", "fp16" or "bf16" in
  // communication_data_type (in any case). Here either is fp32 or the model's own dtype; a third
  // one (fp16 gradients of a bf16 model, bf16 of an fp32 one) is an error. null, or the key left
  // out, keeps hpc_train's value: the model's dtype, as in current DeepSpeed (older versions
  // accumulated a bf16 model's gradients in fp32 when ZeRO was off).

  static std::optional<Precision> deepspeed_dtype(const std::string& name) {
    static const std::pair<const char*, Precision> kNames[] = {
        {"fp32", Precision::kFp32},          {"float32", Precision::kFp32},
        {"float", Precision::kFp32},         {"torch.float32", Precision::kFp32},
        {"fp16", Precision::kFp16},          {"float16", Precision::kFp16},
        {"half", Precision::kFp16},          {"torch.float16", Precision::kFp16},
        {"bf16", Precision::kBf16},          {"bfloat16", Precision::kBf16},
        {"bfloat", Precision::kBf16},        {"torch.bfloat16", Precision::kBf16}};
    for (const auto& [known, precision] : kNames) {
      if (name == known) return precision;
    }
    return std::nullopt;
  }

  void apply_gradient_dtype(const json& value, const std::string& key, const char* option,
                            GradientDtype TrainConfig::*field, bool communication) {
    if (value.is_null() || left_to_us(value, key, option, field)) return;
    const std::string name = text(value, key);
    std::string lookup = name;
    if (communication) {  // DeepSpeed lower-cases this one, and knows only these three names
      std::transform(lookup.begin(), lookup.end(), lookup.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    }
    const bool known = !communication || lookup == "fp32" || lookup == "fp16" || lookup == "bf16";
    const std::optional<Precision> dtype = known ? deepspeed_dtype(lookup) : std::nullopt;
    if (!dtype) {
      throw ConfigError(where() + "'" + key + "' \"" + name + "\": must be \"fp32\", \"fp16\" " +
                        "or \"bf16\"" +
                        (communication ? "" : " (or another of DeepSpeed's names, e.g. \"float32\")"));
    }
    const std::string model = to_string(config_.precision);
    if (*dtype != Precision::kFp32 && *dtype != config_.precision) {
      throw ConfigError(where() + "'" + key + "' \"" + name + "\" is not supported with " +
                        model + " (the model's dtype): hpc_train keeps gradients in the model's " +
                        "dtype or in fp32; give \"" + model + "\" or \"fp32\"");
    }
    set(option, key, field,
        *dtype == Precision::kFp32 ? GradientDtype::kFp32 : GradientDtype::kModel);
  }

  void apply_gradient_dtypes(const json& root) {
    if (const json* block = member(root, "data_types")) {
      const json& types = object(*block, "data_types");
      check_keys(types, "data_types", {"grad_accum_dtype"});
      if (const json* value = member(types, "grad_accum_dtype")) {
        apply_gradient_dtype(*value, "data_types.grad_accum_dtype", "grad-accum-dtype",
                             &TrainConfig::grad_accum_dtype, /*communication=*/false);
      }
    }
    if (const json* value = member(root, "communication_data_type")) {
      apply_gradient_dtype(*value, "communication_data_type", "comm-dtype",
                           &TrainConfig::comm_dtype, /*communication=*/true);
    }
  }

  // After the batch keys: an fp32 accumulation needs a 16-bit model and more than one micro-step.
  void warn_unused_gradient_dtypes() {
    const bool fp32_model = config_.precision == Precision::kFp32;
    const auto from_file = source_of_option_.find("grad-accum-dtype");
    if (from_file != source_of_option_.end() &&
        config_.grad_accum_dtype == GradientDtype::kFp32 && (fp32_model || config_.grad_accum == 1)) {
      warn(from_file->second + " fp32 has no effect: " +
           (fp32_model ? std::string("the model is fp32")
                       : std::string("gradient_accumulation_steps is 1, nothing accumulates")));
    }
    const auto comm_from_file = source_of_option_.find("comm-dtype");
    if (comm_from_file != source_of_option_.end() &&
        config_.comm_dtype == GradientDtype::kFp32 && fp32_model) {
      warn(comm_from_file->second + " fp32 has no effect: the model is fp32");
    }
  }

  void apply_optimizer(const json& value) {
    const json& block = object(value, "optimizer");
    check_keys(block, "optimizer", {"type", "params"});
    const json* type_value = member(block, "type");
    if (!type_value) {
      throw ConfigError(where() + "'optimizer' has no 'type'; give \"Adam\" or \"AdamW\"");
    }
    const bool type_auto =
        left_to_us(*type_value, "optimizer.type", "optimizer", &TrainConfig::optimizer);
    const std::string type =
        type_auto ? to_string(config_.optimizer) : text(*type_value, "optimizer.type");
    std::string lower = type;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    // DeepSpeed has no LARS: no block's params are LARS's to map.
    if (type_auto && config_.optimizer == OptimizerKind::kLars) {
      throw ConfigError(where() + "'optimizer.type' is \"auto\" and --optimizer is lars, which "
                        "DeepSpeed has no optimizer for; remove the 'optimizer' block (the "
                        "LARS options then apply as given) or give a DeepSpeed type");
    }
    // DeepSpeed compares optimizer names in lower case.
    if (lower != "adam" && lower != "adamw" && lower != "sgd" && lower != "lamb") {
      throw ConfigError(where() + "'optimizer.type' \"" + type +
                        "\" is not supported: hpc_train runs \"Adam\" (AdamW unless "
                        "params.adam_w_mode is false, as in DeepSpeed), \"AdamW\", \"SGD\" and "
                        "\"Lamb\"");
    }
    static const json kNoParams = json::object();
    const json* params_value = member(block, "params");
    const json& params = params_value ? object(*params_value, "optimizer.params") : kNoParams;
    if (member(params, "max_grad_norm")) {
      throw ConfigError(where() +
                        "'optimizer.params.max_grad_norm' is not an optimizer parameter "
                        "(DeepSpeed rejects it too); use the top-level \"gradient_clipping\"");
    }
    if (lower == "sgd") {
      apply_sgd(params, type_auto);
      return;
    }
    if (lower == "lamb") {
      apply_lamb(params, type_auto);
      return;
    }
    check_keys(params, "optimizer.params",
               {"lr", "betas", "eps", "weight_decay", "adam_w_mode", "torch_adam"});

    bool adam_w_mode = true;  // DeepSpeed's default: "Adam" means AdamW
    if (const json* mode = member(params, "adam_w_mode");
        mode && !auto_no_op(*mode, "optimizer.params.adam_w_mode")) {
      adam_w_mode = boolean(*mode, "optimizer.params.adam_w_mode");
      if (!adam_w_mode && lower == "adamw") {
        warn("'optimizer.params.adam_w_mode' false has no effect with type AdamW (DeepSpeed "
             "runs AdamW then too)");
      }
    }
    bool torch_adam = false;
    if (const json* torch = member(params, "torch_adam");
        torch && !auto_no_op(*torch, "optimizer.params.torch_adam")) {
      torch_adam = boolean(*torch, "optimizer.params.torch_adam");
      if (torch_adam) {
        warn("'optimizer.params.torch_adam' true only picks PyTorch's Adam implementation in "
             "DeepSpeed; hpc_train's computes the same update");
      }
    }
    const bool adamw = lower == "adamw" || adam_w_mode;
    if (!type_auto) {
      set("optimizer", "optimizer.type", &TrainConfig::optimizer,
          adamw ? OptimizerKind::kAdamW : OptimizerKind::kAdam);
    }
    apply_adam_params(params, torch_adam && adamw ? kDsTorchAdamWWeightDecay
                                                  : kDsFusedAdamWeightDecay);
  }

  // The params that Adam and LAMB share: lr, betas, eps and weight_decay.
  void apply_adam_params(const json& params, double ds_weight_decay) {
    set_number(params, "optimizer.params", "lr", "lr", &TrainConfig::lr, kDsAdamLr);
    const json* betas = member(params, "betas");
    if (betas && is_auto(*betas)) {
      left_to_us(*betas, "optimizer.params.betas[0]", "beta1", &TrainConfig::beta1);
      left_to_us(*betas, "optimizer.params.betas[1]", "beta2", &TrainConfig::beta2);
    } else if (betas) {
      if (!betas->is_array() || betas->size() != 2 || !(*betas)[0].is_number() ||
          !(*betas)[1].is_number()) {
        wrong_type("optimizer.params.betas", "an array of two numbers like [0.9, 0.999]", *betas);
      }
      set("beta1", "optimizer.params.betas[0]", &TrainConfig::beta1, (*betas)[0].get<double>());
      set("beta2", "optimizer.params.betas[1]", &TrainConfig::beta2, (*betas)[1].get<double>());
    } else {
      set("beta1", "optimizer.params.betas[0]", &TrainConfig::beta1, kDsAdamBeta1, false);
      set("beta2", "optimizer.params.betas[1]", &TrainConfig::beta2, kDsAdamBeta2, false);
    }
    set_number(params, "optimizer.params", "eps", "eps", &TrainConfig::eps, kDsAdamEps);
    set_number(params, "optimizer.params", "weight_decay", "weight-decay",
               &TrainConfig::weight_decay, ds_weight_decay);
  }

  // "Lamb" is DeepSpeed's FusedLamb (Note [Trust ratios] in optimizer.h): Adam's params, the
  // trust ratio's bounds, and the bias correction in the step size.
  void apply_lamb(const json& params, bool type_auto) {
    check_keys(params, "optimizer.params",
               {"lr", "betas", "eps", "weight_decay", "bias_correction", "max_coeff",
                "min_coeff", "eps_inside_sqrt", "amsgrad"});
    // Each would change the update; FusedLamb itself refuses amsgrad.
    const std::pair<const char*, const char*> kRefused[] = {
        {"eps_inside_sqrt", "hpc_train adds eps outside the square root, as FusedLamb does by "
                            "default"},
        {"amsgrad", "FusedLamb does not support it either"}};
    for (const auto& [name, why] : kRefused) {
      const std::string key = std::string("optimizer.params.") + name;
      const json* value = member(params, name);
      if (value && !auto_no_op(*value, key) && boolean(*value, key)) {
        throw ConfigError(where() + "'" + key + "' true is not supported (" + why +
                          "); remove the key or set it to false");
      }
    }
    if (!type_auto) {
      set("optimizer", "optimizer.type", &TrainConfig::optimizer, OptimizerKind::kLamb);
    }
    apply_adam_params(params, kDsFusedAdamWeightDecay);
    // The command line's --optimizer won (set() said so): LAMB's own keys mean nothing to it.
    if (config_.optimizer != OptimizerKind::kLamb) return;
    // FusedLamb clamps the ratio to [min_coeff, max_coeff], so its max_coeff 0 makes every ratio
    // min_coeff; hpc_train's 0 means no bound, another run.
    if (const json* max_coeff = member(params, "max_coeff"); max_coeff && !is_auto(*max_coeff)) {
      const double bound = number(*max_coeff, "optimizer.params.max_coeff");
      if (bound <= 0) {
        throw ConfigError(where() + "'optimizer.params.max_coeff' " + max_coeff->dump() +
                          " must be > 0 (the trust ratio's upper bound; FusedLamb's default is "
                          "10)");
      }
    }
    set_number(params, "optimizer.params", "max_coeff", "max-trust-ratio",
               &TrainConfig::max_trust_ratio, kDsLambMaxCoeff);
    set_number(params, "optimizer.params", "min_coeff", "min-trust-ratio",
               &TrainConfig::min_trust_ratio, kDsLambMinCoeff);
    const json* correction = member(params, "bias_correction");
    if (correction && left_to_us(*correction, "optimizer.params.bias_correction",
                                 "lamb-bias-correction", &TrainConfig::lamb_bias_correction)) {
      return;
    }
    const bool corrects =
        correction ? boolean(*correction, "optimizer.params.bias_correction") : true;
    set("lamb-bias-correction", "optimizer.params.bias_correction",
        &TrainConfig::lamb_bias_correction,
        corrects ? LambBiasCorrection::kStepSize : LambBiasCorrection::kNone,
        correction != nullptr);
  }

  // DeepSpeed's warm-up is at least 2 steps long (it divides by log(warmup_num_steps)).
  int64_t warmup_num_steps(const json& params) {
    const json* value = member(params, "warmup_num_steps");
    if (!value) return kDsWarmupNumSteps;
    const int64_t steps = whole(*value, "scheduler.params.warmup_num_steps");
    if (steps < kDsMinWarmupNumSteps) {
      warn("'scheduler.params.warmup_num_steps' " + std::to_string(steps) + " becomes " +
           std::to_string(kDsMinWarmupNumSteps) +
           ", as in DeepSpeed, whose warm-up lasts at least 2 steps");
      return kDsMinWarmupNumSteps;
    }
    return steps;
  }

  // DeepSpeed hands an optimizer type it does not implement itself to torch.optim by name, with
  // the params as keyword arguments: "SGD" is torch.optim.SGD.
  void apply_sgd(const json& params, bool type_auto) {
    check_keys(params, "optimizer.params",
               {"lr", "momentum", "dampening", "weight_decay", "nesterov"});
    if (!type_auto) set("optimizer", "optimizer.type", &TrainConfig::optimizer, OptimizerKind::kSgd);
    set_number(params, "optimizer.params", "lr", "lr", &TrainConfig::lr, kDsSgdLr);
    set_number(params, "optimizer.params", "momentum", "momentum", &TrainConfig::momentum, 0.0);
    set_number(params, "optimizer.params", "dampening", "dampening", &TrainConfig::dampening, 0.0);
    set_number(params, "optimizer.params", "weight_decay", "weight-decay",
               &TrainConfig::weight_decay, 0.0);
    const json* nesterov = member(params, "nesterov");
    if (nesterov && left_to_us(*nesterov, "optimizer.params.nesterov", "nesterov",
                               &TrainConfig::nesterov)) {
      return;
    }
    set("nesterov", "optimizer.params.nesterov", &TrainConfig::nesterov,
        nesterov ? boolean(*nesterov, "optimizer.params.nesterov") : false, nesterov != nullptr);
  }

  // A whole number of steps >= 0 from `params`, or DeepSpeed's default.
  void set_steps(const json& params, const char* name, const char* option,
                 int64_t TrainConfig::*field, int64_t ds_default) {
    const std::string key = std::string("scheduler.params.") + name;
    const json* value = member(params, name);
    if (value && left_to_us(*value, key, option, field)) return;
    const int64_t steps = value ? whole(*value, key) : ds_default;
    if (steps < 0) throw ConfigError(where() + "'" + key + "' " + std::to_string(steps) + ": must be >= 0");
    set(option, key, field, steps, value != nullptr);
  }

  // The peak lr of a schedule (WarmupLR's warmup_max_lr, OneCycle's cycle_max_lr) replaces the
  // optimizer's lr, as in DeepSpeed, which sets the groups' lr from the schedule.
  void set_peak_lr(const json& value, const std::string& key, const json& root) {
    if (left_to_us(value, key, "lr", &TrainConfig::lr)) return;
    const double lr = number(value, key);
    const json* optimizer = member(root, "optimizer");
    const json* params_of_optimizer = optimizer ? member(*optimizer, "params") : nullptr;
    const json* optimizer_lr = params_of_optimizer ? member(*params_of_optimizer, "lr") : nullptr;
    if (optimizer_lr && optimizer_lr->is_number() && optimizer_lr->get<double>() != lr) {
      warn("'optimizer.params.lr' " + show(optimizer_lr->get<double>()) + " is replaced by '" +
           key + "' " + show(lr) + ", as in DeepSpeed");
    }
    set("lr", key, &TrainConfig::lr, lr);
  }

  // WarmupLR's params (WarmupDecayLR's too): the peak, the warm-up and its start.
  void apply_warmup_lr(const json& params, const json& root) {
    // Without warmup_max_lr, DeepSpeed warms up to the optimizer's lr (older versions: 1e-3).
    if (const json* max_lr = member(params, "warmup_max_lr"))
      set_peak_lr(*max_lr, "scheduler.params.warmup_max_lr", root);
    apply_warmup_num_steps(params);
    apply_warmup_type(params);
    // DeepSpeed's warmup_min_lr is absolute; here the start is a fraction of the lr that the
    // run uses (the command line's, if it gave one), which keeps the file's starting lr.
    const json* min_value = member(params, "warmup_min_lr");
    if (min_value && left_to_us(*min_value, "scheduler.params.warmup_min_lr",
                                "warmup-start-ratio", &TrainConfig::warmup_start_ratio)) {
      return;
    }
    const double min_lr =
        min_value ? number(*min_value, "scheduler.params.warmup_min_lr") : kDsWarmupMinLr;
    if (min_lr < 0 || (config_.lr > 0 && min_lr > config_.lr)) {
      throw ConfigError(where() + "'scheduler.params.warmup_min_lr' " + show(min_lr) +
                        " must be in [0, " + show(config_.lr) +
                        "] (the lr it warms up to): hpc_train's warm-up rises");
    }
    if (config_.lr > 0) {
      set("warmup-start-ratio", "scheduler.params.warmup_min_lr",
          &TrainConfig::warmup_start_ratio, min_lr / config_.lr, min_value != nullptr);
    }
  }

  void apply_one_cycle(const json& params, const json& root) {
    check_keys(params, "scheduler.params",
               {"cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size",
                "cycle_second_step_size", "cycle_first_stair_count", "cycle_second_stair_count",
                "decay_step_size", "cycle_momentum", "cycle_min_mom", "cycle_max_mom",
                "decay_mom_rate", "last_batch_iteration"});
    check_last_batch_iteration(params);
    for (const char* name : {"cycle_min_lr", "cycle_max_lr"}) {
      if (!member(params, name))
        throw ConfigError(where() + "OneCycle needs 'scheduler.params." + name +
                          "' (DeepSpeed requires it too)");
    }
    for (const char* name : {"cycle_first_stair_count", "cycle_second_stair_count"}) {
      if (member(params, name))
        warn(std::string("'scheduler.params.") + name +
             "' is accepted and has no effect, as in DeepSpeed, whose OneCycle keeps but never "
             "reads it");
    }
    set("lr-schedule", "scheduler.type", &TrainConfig::lr_schedule, LrScheduleKind::kOneCycle);
    set_peak_lr(*member(params, "cycle_max_lr"), "scheduler.params.cycle_max_lr", root);
    // DeepSpeed's cycle_min_lr is absolute; here a fraction of the peak, as --warmup-start-ratio.
    const json& min_value = *member(params, "cycle_min_lr");
    if (!left_to_us(min_value, "scheduler.params.cycle_min_lr", "cycle-min-ratio",
                    &TrainConfig::cycle_min_ratio)) {
      const double min_lr = number(min_value, "scheduler.params.cycle_min_lr");
      if (min_lr < 0 || min_lr > config_.lr) {
        throw ConfigError(where() + "'scheduler.params.cycle_min_lr' " + show(min_lr) +
                          " must be in [0, " + show(config_.lr) + "] (the cycle's peak)");
      }
      set("cycle-min-ratio", "scheduler.params.cycle_min_lr", &TrainConfig::cycle_min_ratio,
          min_lr / config_.lr);
    }
    set_steps(params, "cycle_first_step_size", "cycle-first-steps",
              &TrainConfig::cycle_first_steps, kDsCycleFirstStepSize);
    // DeepSpeed's default for the way down is the way up: --cycle-second-steps 0 means that.
    set_steps(params, "cycle_second_step_size", "cycle-second-steps",
              &TrainConfig::cycle_second_steps, 0);
    set_steps(params, "decay_step_size", "cycle-decay-steps", &TrainConfig::cycle_decay_steps, 0);
    set_number(params, "scheduler.params", "decay_lr_rate", "cycle-decay-lr-rate",
               &TrainConfig::cycle_decay_lr_rate, 0.0);
    set_number(params, "scheduler.params", "decay_mom_rate", "cycle-decay-momentum-rate",
               &TrainConfig::cycle_decay_momentum_rate, 0.0);
    set_number(params, "scheduler.params", "cycle_min_mom", "cycle-min-momentum",
               &TrainConfig::cycle_min_momentum, kDsCycleMinMom);
    set_number(params, "scheduler.params", "cycle_max_mom", "cycle-max-momentum",
               &TrainConfig::cycle_max_momentum, kDsCycleMaxMom);
    const json* cycle = member(params, "cycle_momentum");
    if (cycle && left_to_us(*cycle, "scheduler.params.cycle_momentum", "cycle-momentum",
                            &TrainConfig::cycle_momentum)) {
      return;
    }
    const bool cycles = cycle ? boolean(*cycle, "scheduler.params.cycle_momentum") : true;
    set("cycle-momentum", "scheduler.params.cycle_momentum", &TrainConfig::cycle_momentum, cycles,
        cycle != nullptr);
    // Note [Cycled momentum] in lr_schedule.h: DeepSpeed sets Adam's (and FusedLamb's) beta2 to
    // 0.99 while it cycles beta1, and does not cycle SGD's momentum (its SGD has no betas).
    if (cycles && keeps_adam_moments(config_.optimizer)) {
      if (config_.beta2 != kDsOneCycleBeta2) {
        warn("'optimizer.params.betas[1]' " + show(config_.beta2) + " becomes " +
             show(kDsOneCycleBeta2) + " under OneCycle's cycle_momentum, as in DeepSpeed");
      }
      set("beta2", "scheduler.params.cycle_momentum", &TrainConfig::beta2, kDsOneCycleBeta2);
    } else if (cycles) {
      warn("OneCycle's cycle_momentum: DeepSpeed cycles only betas and leaves the momentum of " +
           to_string(config_.optimizer) + " alone, hpc_train cycles it as PyTorch's OneCycleLR "
           "does; give \"cycle_momentum\": false for DeepSpeed's behaviour");
    }
  }

  void apply_warmup_num_steps(const json& params) {
    const json* value = member(params, "warmup_num_steps");
    if (value && left_to_us(*value, "scheduler.params.warmup_num_steps", "warmup-steps",
                            &TrainConfig::warmup_steps)) {
      return;
    }
    set("warmup-steps", "scheduler.params.warmup_num_steps", &TrainConfig::warmup_steps,
        warmup_num_steps(params), value != nullptr);
  }

  void apply_warmup_type(const json& params) {
    const json* value = member(params, "warmup_type");
    if (value && left_to_us(*value, "scheduler.params.warmup_type", "warmup-type",
                            &TrainConfig::warmup_type)) {
      return;
    }
    const std::string type = value ? text(*value, "scheduler.params.warmup_type") : kDsWarmupType;
    // DeepSpeed's names are hpc_train's. DeepSpeed falls back to log with a printed warning; a
    // typo should not change the schedule.
    const std::optional<WarmupType> warmup_type = parse_choice<WarmupType>(type);
    if (!warmup_type) {
      throw ConfigError(where() + "'scheduler.params.warmup_type' \"" + type +
                        "\": must be \"log\" or \"linear\"");
    }
    set("warmup-type", "scheduler.params.warmup_type", &TrainConfig::warmup_type, *warmup_type,
        value != nullptr);
  }

  void check_last_batch_iteration(const json& params) {
    const json* value = member(params, "last_batch_iteration");
    if (!value || auto_no_op(*value, "scheduler.params.last_batch_iteration")) return;
    if (whole(*value, "scheduler.params.last_batch_iteration") != -1) {
      throw ConfigError(where() +
                        "'scheduler.params.last_batch_iteration' resumes DeepSpeed's schedule "
                        "mid-way; hpc_train resumes from its checkpoints: remove the key or "
                        "give -1");
    }
  }

  void apply_scheduler(const json& value, const json& root) {
    const json& block = object(value, "scheduler");
    check_keys(block, "scheduler", {"type", "params"});
    const json* type_value = member(block, "type");
    if (!type_value) {
      throw ConfigError(where() +
                        "'scheduler' has no 'type'; give \"WarmupLR\", \"WarmupCosineLR\", "
                        "\"WarmupDecayLR\" or \"OneCycle\"");
    }
    const std::string type = text(*type_value, "scheduler.type");
    static const json kNoParams = json::object();
    const json* params_value = member(block, "params");
    const json& params = params_value ? object(*params_value, "scheduler.params") : kNoParams;

    if (type == "WarmupLR") {
      check_keys(params, "scheduler.params",
                 {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                  "last_batch_iteration"});
      check_last_batch_iteration(params);
      set("lr-schedule", "scheduler.type", &TrainConfig::lr_schedule, LrScheduleKind::kWarmup);
      apply_warmup_lr(params, root);
    } else if (type == "WarmupDecayLR") {
      check_keys(params, "scheduler.params",
                 {"total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                  "warmup_type", "last_batch_iteration"});
      check_last_batch_iteration(params);
      const json* total = member(params, "total_num_steps");
      if (!total) {
        throw ConfigError(where() +
                          "WarmupDecayLR needs 'scheduler.params.total_num_steps' (the step at "
                          "which the decay ends; DeepSpeed requires it too)");
      }
      set("lr-schedule", "scheduler.type", &TrainConfig::lr_schedule,
          LrScheduleKind::kWarmupDecay);
      if (!left_to_us(*total, "scheduler.params.total_num_steps", "schedule-steps",
                      &TrainConfig::schedule_steps)) {
        set("schedule-steps", "scheduler.params.total_num_steps", &TrainConfig::schedule_steps,
            whole(*total, "scheduler.params.total_num_steps"));
      }
      apply_warmup_lr(params, root);
    } else if (type == "OneCycle") {
      apply_one_cycle(params, root);
    } else if (type == "WarmupCosineLR") {
      check_keys(params, "scheduler.params",
                 {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio",
                  "warmup_type", "last_batch_iteration"});
      check_last_batch_iteration(params);
      const json* total = member(params, "total_num_steps");
      if (!total) {
        throw ConfigError(where() +
                          "WarmupCosineLR needs 'scheduler.params.total_num_steps' (the step "
                          "at which the cosine ends; DeepSpeed requires it too)");
      }
      set("lr-schedule", "scheduler.type", &TrainConfig::lr_schedule,
          LrScheduleKind::kWarmupCosine);
      if (!left_to_us(*total, "scheduler.params.total_num_steps", "schedule-steps",
                      &TrainConfig::schedule_steps)) {
        set("schedule-steps", "scheduler.params.total_num_steps", &TrainConfig::schedule_steps,
            whole(*total, "scheduler.params.total_num_steps"));
      }
      apply_warmup_num_steps(params);
      apply_warmup_type(params);
      // WarmupCosineLR scales the optimizer's lr; its ratios are fractions of it, as here.
      set_number(params, "scheduler.params", "warmup_min_ratio", "warmup-start-ratio",
                 &TrainConfig::warmup_start_ratio, kDsWarmupMinRatio);
      set_number(params, "scheduler.params", "cos_min_ratio", "cosine-final-ratio",
                 &TrainConfig::cosine_final_ratio, kDsCosMinRatio);
    } else {
      throw ConfigError(where() + "'scheduler.type' \"" + type +
                        "\" is not supported: hpc_train has \"WarmupLR\" (--lr-schedule warmup), "
                        "\"WarmupCosineLR\" (warmup-cosine), \"WarmupDecayLR\" (warmup-decay) "
                        "and \"OneCycle\" (one-cycle)");
    }
  }

  void check_no_offload(const json& zero, const char* name) {
    const json* value = member(zero, name);
    if (!value) return;
    const std::string key = std::string("zero_optimization.") + name;
    const json& block = object(*value, key);
    const json* device = member(block, "device");
    // DeepSpeed's default device is "none"; the block's other keys matter only when offloading.
    if (!device || text(*device, key + ".device") == "none") return;
    throw ConfigError(where() + "'" + key + ".device' \"" + device->get<std::string>() +
                      "\" is not supported: hpc_train keeps parameters and optimizer state on "
                      "the GPU (ZeRO 1 and 2 partition them across ranks); give \"none\" or "
                      "remove '" + key + "'");
  }

  void apply_zero(const json& value) {
    const json& block = object(value, "zero_optimization");
    // ZeRO++'s quantized weights and gradients change the values that ranks exchange: refused
    // (Note [Keys hpc_train does not implement]) unless false. Other unknown keys of this block
    // (sub_group_size, round_robin_gradients, the stage 3 keys, ...) only move time and memory.
    for (const char* quantized : {"zero_quantized_weights", "zero_quantized_gradients",
                                  "zero_quantized_nontrainable_weights"}) {
      const json* value = member(block, quantized);
      if (!value || (value->is_boolean() && !value->get<bool>()) || is_auto(*value)) continue;
      const std::string key = std::string("zero_optimization.") + quantized;
      if (allow_unknown_) {
        warn("ignoring '" + key + "' (--deepspeed-allow-unknown), which changes the result");
        continue;
      }
      throw ConfigError(where() + "'" + key + "' " + value->dump() +
                        " is not supported: quantized communication changes the values the "
                        "ranks exchange; remove it or give false (--deepspeed-allow-unknown "
                        "ignores it anyway)");
    }
    check_keys(block, "zero_optimization",
               {"stage", "reduce_bucket_size", "allgather_bucket_size", "overlap_comm",
                "contiguous_gradients", "reduce_scatter", "allgather_partitions",
                "offload_optimizer", "offload_param", "zero_quantized_weights",
                "zero_quantized_gradients", "zero_quantized_nontrainable_weights"},
               Unknown::kWarn);
    if (const json* stage_value = member(block, "stage");
        stage_value &&
        !left_to_us(*stage_value, "zero_optimization.stage", "zero-stage",
                    &TrainConfig::zero_stage)) {
      const int64_t stage = whole(*stage_value, "zero_optimization.stage");
      if (stage < 0 || stage > 2) {
        throw ConfigError(where() + "'zero_optimization.stage' " + std::to_string(stage) +
                          ": hpc_train supports ZeRO stages 0, 1 and 2" +
                          (stage == 3 ? " (stage 3 also partitions the parameters); use 2, "
                                        "which partitions gradients and optimizer state"
                                      : ""));
      }
      set("zero-stage", "zero_optimization.stage", &TrainConfig::zero_stage,
          static_cast<int>(stage));
    }
    check_no_offload(block, "offload_optimizer");
    check_no_offload(block, "offload_param");
    if (const json* overlap = member(block, "overlap_comm");
        overlap && !left_to_us(*overlap, "zero_optimization.overlap_comm", "overlap-comm",
                               &TrainConfig::overlap_comm)) {
      set("overlap-comm", "zero_optimization.overlap_comm", &TrainConfig::overlap_comm,
          boolean(*overlap, "zero_optimization.overlap_comm"));
    }
    if (const json* contiguous = member(block, "contiguous_gradients");
        contiguous && !auto_no_op(*contiguous, "zero_optimization.contiguous_gradients")) {
      if (!boolean(*contiguous, "zero_optimization.contiguous_gradients")) {
        warn("'zero_optimization.contiguous_gradients' false has no effect: hpc_train's "
             "gradients always live in flat bucket storage");
      }
    }
    // reduce_scatter false makes DeepSpeed's stage 2 all-reduce and keep its own partition: the
    // same numbers with twice the traffic. Warning rather than error: the result does not change.
    if (const json* scatter = member(block, "reduce_scatter");
        scatter && !auto_no_op(*scatter, "zero_optimization.reduce_scatter")) {
      if (!boolean(*scatter, "zero_optimization.reduce_scatter") && config_.zero_stage == 2) {
        warn("'zero_optimization.reduce_scatter' false has no effect: hpc_train's ZeRO stage 2 "
             "always reduce-scatters gradients (the same result as DeepSpeed's all-reduce, with "
             "half the traffic)");
      }
    }
    if (const json* partitions = member(block, "allgather_partitions");
        partitions && !auto_no_op(*partitions, "zero_optimization.allgather_partitions")) {
      if (!boolean(*partitions, "zero_optimization.allgather_partitions")) {
        warn("'zero_optimization.allgather_partitions' false has no effect: hpc_train always "
             "all-gathers the updated parameters (the same result as DeepSpeed's broadcasts)");
      }
    }

    // DeepSpeed counts bucket sizes in ELEMENTS of the gradients' dtype, hpc_train in MiB: an
    // element is 2 bytes in fp16 and bf16 and 4 in fp32 (the model's, or --comm-dtype fp32, the
    // dtype the collectives move), so 5e8 elements are 953.7 MiB in fp16.
    const bool fp32_elements =
        config_.precision == Precision::kFp32 || config_.comm_dtype == GradientDtype::kFp32;
    const double element_bytes = fp32_elements ? 4.0 : 2.0;
    std::optional<int64_t> reduce_elements;
    if (const json* reduce = member(block, "reduce_bucket_size");
        reduce && !left_to_us(*reduce, "zero_optimization.reduce_bucket_size", "bucket-mb",
                              &TrainConfig::bucket_mb)) {
      reduce_elements = whole(*reduce, "zero_optimization.reduce_bucket_size");
      if (*reduce_elements < 1) {
        throw ConfigError(where() + "'zero_optimization.reduce_bucket_size' " +
                          std::to_string(*reduce_elements) +
                          " must be at least 1 (elements per gradient bucket), e.g. 5e8");
      }
      set("bucket-mb", "zero_optimization.reduce_bucket_size", &TrainConfig::bucket_mb,
          static_cast<double>(*reduce_elements) * element_bytes / kBytesPerMiB);
    }
    if (const json* gather = member(block, "allgather_bucket_size");
        gather && !auto_no_op(*gather, "zero_optimization.allgather_bucket_size")) {
      const int64_t gather_elements = whole(*gather, "zero_optimization.allgather_bucket_size");
      if (!reduce_elements || gather_elements != *reduce_elements) {
        warn("'zero_optimization.allgather_bucket_size' " + std::to_string(gather_elements) +
             " has no effect: hpc_train all-gathers parameters in the gradient buckets "
             "(reduce_bucket_size, --bucket-mb)");
      }
    }
  }

  // --- Note [Batch identity]

  std::optional<int64_t> batch_key(const json& root, const char* key) {
    const json* value = member(root, key);
    // null means "not given" to DeepSpeed (it reads these with dict.get); "auto" means the same
    // here (Note ["auto" values]; apply_batch names what it resolved to).
    if (!value || value->is_null() || is_auto(*value)) return std::nullopt;
    const int64_t number = whole(*value, key);
    if (number < 1) {
      throw ConfigError(where() + "'" + key + "' " + std::to_string(number) +
                        " must be at least 1");
    }
    return number;
  }

  // Rank counts that divide `samples` (each rank gets samples / ranks): the ones up to the
  // world size nearest to it, and the next larger one, e.g. "1, 2 or 4" for 64 at 3 ranks. The
  // search for the larger one stops at kMaxSuggestedRanks, so that it takes no time for any
  // train_batch_size (a search of all divisors up to sqrt(2^63) never ended).
  static std::vector<int64_t> divisor_ranks(int64_t samples, int64_t world) {
    constexpr int64_t kMaxSuggestedRanks = int64_t{1} << 20;
    std::vector<int64_t> below;
    for (int64_t d = 1; d <= std::min(samples, world); ++d) {
      if (samples % d == 0) below.push_back(d);
    }
    constexpr size_t kShownBelow = 3;
    const size_t first = below.size() > kShownBelow ? below.size() - kShownBelow : 0;
    std::vector<int64_t> chosen(below.begin() + static_cast<std::ptrdiff_t>(first), below.end());
    for (int64_t d = world + 1; d <= std::min(samples, kMaxSuggestedRanks); ++d) {
      if (samples % d == 0) {
        chosen.push_back(d);
        break;
      }
    }
    return chosen;
  }

  // Multiples of `unit` next to `samples`, e.g. "63 or 66" for 64 and 3 (0, and one beyond
  // the int64 range, left out).
  static std::vector<int64_t> nearby_multiples(int64_t samples, int64_t unit) {
    std::vector<int64_t> multiples;
    const int64_t below = samples / unit * unit;
    if (below > 0) multiples.push_back(below);
    int64_t above = 0;
    if (!__builtin_add_overflow(below, unit, &above)) multiples.push_back(above);
    return multiples;
  }

  // The batch factors given (by the file or the command line) and the world size must multiply
  // within 64 bits: the identity's products below, and the run's global batch, are int64. Python
  // integers do not overflow, so DeepSpeed would just find no such batch; a C++ product that
  // wrapped around could even pass the identity.
  void require_batch_product_fits(const std::optional<int64_t>& micro,
                                  const std::optional<int64_t>& accum,
                                  bool micro_from_command_line,
                                  bool accum_from_command_line) const {
    int64_t product = world_size_;
    bool overflow = false;
    std::string keys, factors, sources;
    const auto factor = [&](const std::optional<int64_t>& value, const char* key,
                            bool from_command_line, const char* option) {
      if (!value) return;
      keys += std::string(key) + " x ";
      factors += std::to_string(*value) + " x ";
      overflow = overflow || __builtin_mul_overflow(product, *value, &product);
      if (from_command_line) {
        sources += std::string(" The ") + key + " " + std::to_string(*value) + " is --" + option +
                   " on the command line.";
      }
    };
    factor(micro, "train_micro_batch_size_per_gpu", micro_from_command_line, "micro-batch");
    factor(accum, "gradient_accumulation_steps", accum_from_command_line, "grad-accum");
    if (!overflow) return;
    throw ConfigError(where() + keys + "world size = " + factors + ranks(world_size_) +
                      " overflows a 64-bit integer: no batch can have that many samples." +
                      sources + " Give smaller values");
  }

  enum class Given { kAll, kBatchAndMicro, kBatchAndAccum, kBatchOnly };

  [[noreturn]] void batch_mismatch(Given given, int64_t batch, int64_t micro, int64_t accum,
                                   bool micro_from_command_line, bool accum_from_command_line,
                                   int64_t configured_micro) const {
    const int64_t world = world_size_;
    std::string message = where() + "train_batch_size " + std::to_string(batch) +
                          " must equal train_micro_batch_size_per_gpu x "
                          "gradient_accumulation_steps x world size (" +
                          std::to_string(micro) + " x " + std::to_string(accum) + " x " +
                          std::to_string(world) + " = " + std::to_string(micro * accum * world) +
                          " with " + ranks(world) + ").";
    if (micro_from_command_line) {
      message += " The micro-batch " + std::to_string(micro) +
                 " is --micro-batch on the command line.";
    }
    if (accum_from_command_line) {
      message += " The gradient_accumulation_steps " + std::to_string(accum) +
                 " is --grad-accum on the command line.";
    }
    message += " With " + ranks(world) + " ";
    switch (given) {
      case Given::kBatchOnly:
      case Given::kBatchAndAccum: {
        // The micro-batch is derived: the batch must split evenly over ranks x accumulation.
        const int64_t unit = world * accum;
        message += "use a train_batch_size divisible by " +
                   (accum == 1 ? std::to_string(world)
                               : std::to_string(world) + " x " + std::to_string(accum) + " = " +
                                     std::to_string(unit)) +
                   ", e.g. " + join_or(nearby_multiples(batch, unit));
        const std::vector<int64_t> nearby = nearby_multiples(batch, unit);
        int64_t with_configured = 0;
        if (!__builtin_mul_overflow(unit, configured_micro, &with_configured) &&
            std::find(nearby.begin(), nearby.end(), with_configured) == nearby.end()) {
          message += " (or " + std::to_string(with_configured) + " for micro-batch " +
                     std::to_string(configured_micro) + ")";
        }
        if (batch % accum == 0) {
          const int64_t per_step = batch / accum;
          message += "; or run " + std::to_string(batch) + " on " +
                     ranks(divisor_ranks(per_step, world)) + " (any divisor of " +
                     std::to_string(per_step) + ")";
        } else {
          message += "; or a gradient_accumulation_steps that divides " + std::to_string(batch);
        }
        break;
      }
      case Given::kBatchAndMicro: {
        // The accumulation is derived: the batch must be a multiple of ranks x micro-batch.
        const int64_t unit = world * micro;
        message += "and micro-batch " + std::to_string(micro) +
                   " use a train_batch_size divisible by " + std::to_string(world) + " x " +
                   std::to_string(micro) + " = " + std::to_string(unit) + ", e.g. " +
                   join_or(nearby_multiples(batch, unit));
        if (batch % micro == 0) {
          const int64_t micro_steps = batch / micro;
          message += "; or run " + std::to_string(batch) + " on " +
                     ranks(divisor_ranks(micro_steps, world)) + " (any divisor of " +
                     std::to_string(micro_steps) + ")";
        } else {
          message += "; or a micro-batch that divides " + std::to_string(batch);
        }
        break;
      }
      case Given::kAll: {
        message += "use train_batch_size " + std::to_string(micro * accum * world) +
                   ", or leave one of the three out so that it is derived";
        if (batch % (micro * accum) == 0) {
          message += "; or run it on " + ranks(batch / (micro * accum));
        }
        break;
      }
    }
    throw ConfigError(message);
  }

  void apply_batch(const json& root) {
    if (const json* value = member(root, "train_micro_batch_size_per_gpu")) {
      left_to_us(*value, "train_micro_batch_size_per_gpu", "micro-batch",
                 &TrainConfig::micro_batch);
    }
    if (const json* value = member(root, "gradient_accumulation_steps"))
      left_to_us(*value, "gradient_accumulation_steps", "grad-accum", &TrainConfig::grad_accum);
    if (const json* value = member(root, "train_batch_size"); value && is_auto(*value)) {
      auto_keys_.emplace_back("train_batch_size", [this] {
        return std::to_string(int64_t{config_.micro_batch} * config_.grad_accum * world_size_) +
               " (micro-batch " + std::to_string(config_.micro_batch) + " x grad-accum " +
               std::to_string(config_.grad_accum) + " x " + ranks(world_size_) + ")";
      });
    }
    const std::optional<int64_t> file_batch = batch_key(root, "train_batch_size");
    std::optional<int64_t> micro = batch_key(root, "train_micro_batch_size_per_gpu");
    std::optional<int64_t> accum = batch_key(root, "gradient_accumulation_steps");
    const int64_t configured_micro = config_.micro_batch;
    const int64_t configured_accum = config_.grad_accum;

    // The command line's values count as given, and win over the file's.
    const bool micro_from_command_line = given_.count("micro-batch") > 0;
    const bool accum_from_command_line = given_.count("grad-accum") > 0;
    // Note ["auto" values]: an "auto" micro-batch or accumulation is ours, and counts as given
    // (train_batch_size "auto" is then derived from them).
    const json* micro_value = member(root, "train_micro_batch_size_per_gpu");
    const json* accum_value = member(root, "gradient_accumulation_steps");
    if (micro_value && is_auto(*micro_value)) micro = config_.micro_batch;
    if (accum_value && is_auto(*accum_value)) accum = config_.grad_accum;
    if (micro_from_command_line) {
      if (micro && *micro != config_.micro_batch) {
        warn("'train_micro_batch_size_per_gpu' " + std::to_string(*micro) +
             " is not used: --micro-batch " + std::to_string(config_.micro_batch) +
             " on the command line wins");
      }
      micro = config_.micro_batch;
    }
    if (accum_from_command_line) {
      if (accum && *accum != config_.grad_accum) {
        warn("'gradient_accumulation_steps' " + std::to_string(*accum) +
             " is not used: --grad-accum " + std::to_string(config_.grad_accum) +
             " on the command line wins");
      }
      accum = config_.grad_accum;
    }
    if (!file_batch && !micro) {
      // DeepSpeed stops here; the run's own micro-batch (and grad_accum) do instead. The
      // micro-batch cannot be the command line's here: that one counts as given.
      micro = config_.micro_batch;
      std::string used = "micro-batch " + std::to_string(*micro);
      if (!accum) {
        accum = config_.grad_accum;
        used += " and grad_accum " + std::to_string(*accum);
      }
      warn("gives neither train_batch_size nor train_micro_batch_size_per_gpu; using " + used +
           " of the INI file or defaults");
    }

    require_batch_product_fits(micro, accum, micro_from_command_line, accum_from_command_line);
    const int64_t world = world_size_;
    int64_t batch = 0;
    Given given = Given::kAll;
    if (file_batch && micro && accum) {
      batch = *file_batch;
      given = Given::kAll;
    } else if (file_batch && micro) {
      batch = *file_batch;
      accum = batch / *micro / world;
      given = Given::kBatchAndMicro;
    } else if (file_batch && accum) {
      batch = *file_batch;
      micro = batch / world / *accum;
      given = Given::kBatchAndAccum;
    } else if (micro && accum) {
      batch = *micro * *accum * world;
    } else if (file_batch) {
      batch = *file_batch;
      accum = 1;
      micro = batch / world;
      given = Given::kBatchOnly;
    } else {
      accum = 1;
      batch = *micro * world;
    }
    if (*micro < 1 || *accum < 1 || batch != *micro * *accum * world) {
      batch_mismatch(given, batch, *micro, *accum, micro_from_command_line,
                     accum_from_command_line, configured_micro);
    }
    // An accumulation set in the INI file but replaced by DeepSpeed's derivation (which the
    // file does not show) deserves a word; the default 1 does not.
    const bool accum_in_file = member(root, "gradient_accumulation_steps") != nullptr;
    if (!accum_from_command_line && !accum_in_file && *accum != configured_accum &&
        configured_accum != TrainConfig{}.grad_accum) {
      warn("gradient_accumulation_steps is " + std::to_string(*accum) +
           ", as DeepSpeed derives it from this file; the grad_accum " +
           std::to_string(configured_accum) + " of the INI file or defaults is not used");
    }
    set("micro-batch", "train_micro_batch_size_per_gpu", &TrainConfig::micro_batch,
        to_int(*micro, "train_micro_batch_size_per_gpu"));
    set("grad-accum", "gradient_accumulation_steps", &TrainConfig::grad_accum,
        to_int(*accum, "gradient_accumulation_steps"));
  }

  // --- Range checks, with the message naming the key that set the value.

  void validate_mapped() const {
    try {
      validate(config_);
    } catch (const ConfigError& e) {
      const std::string message = e.what();
      for (const auto& [option, key] : source_of_option_) {
        if (message.rfind("--" + option + " ", 0) == 0) {
          throw ConfigError(where() + key + " gives " + message);
        }
      }
      throw;
    }
  }

  // --- Helpers for a key of a block: its value, or DeepSpeed's default when it is left out.

  void set_number(const json& block, const std::string& prefix, const char* name,
                  const char* option, double TrainConfig::*field, double ds_default) {
    const std::string key = prefix + "." + name;
    if (const json* value = member(block, name)) {
      if (left_to_us(*value, key, option, field)) return;
      set(option, key, field, number(*value, key));
    } else {
      set(option, key, field, ds_default, false);
    }
  }

  void set_int(const json& block, const std::string& prefix, const char* name, const char* option,
               int TrainConfig::*field, int ds_default) {
    const std::string key = prefix + "." + name;
    if (const json* value = member(block, name)) {
      if (left_to_us(*value, key, option, field)) return;
      set(option, key, field, to_int(whole(*value, key), key));
    } else {
      set(option, key, field, ds_default, false);
    }
  }

  std::string path_;
  bool allow_unknown_;
  int world_size_;
  const std::set<std::string>& given_;
  TrainConfig& config_;
  std::vector<std::string> warnings_;
  std::map<std::string, std::string> source_of_option_;  // option -> "'key'" that set it
  // Keys given as "auto", and what each resolved to (read at the end of the import).
  std::vector<std::pair<std::string, std::function<std::string()>>> auto_keys_;
};

}  // namespace

std::vector<std::string> apply_deepspeed_config(const DeepSpeedImport& import, int world_size,
                                                const std::set<std::string>& given_on_command_line,
                                                TrainConfig& config) {
  if (world_size < 1) {
    throw Error("apply_deepspeed_config: world size " + std::to_string(world_size) +
                " (must be at least 1)");
  }
  if (import.path.empty()) return {};
  // Work on a copy, so that a failure leaves the caller's configuration as it was.
  TrainConfig updated = config;
  std::vector<std::string> warnings =
      Importer(import, world_size, given_on_command_line, updated).run();
  config = updated;
  return warnings;
}

}  // namespace hpc_train

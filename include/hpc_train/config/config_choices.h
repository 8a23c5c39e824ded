// The choices of the run's configuration, as types (DESIGN.md: choices are types).
//
// Note [Choice names]: each enum has one table of (value, name) pairs, every value once, in the
// order that messages list them. A name is what the command line and the INI file take, what
// to_ini writes back, and what log lines, metrics, summary.json and the checkpoint's precision
// attribute show, so the names are part of the file formats: change none. Names become values
// where the configuration is read (config.cpp, deepspeed_config.cpp); everything else compares
// values, and turns a value into its name only to print or store it.
#pragma once

#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "hpc_train/error.h"
#include "hpc_train/optim/lr_schedule.h"  // LrScheduleKind (--lr-schedule), WarmupType (--warmup-type)
#include "hpc_train/optim/trust_ratio.h"  // LambBiasCorrection (--lamb-bias-correction)

namespace hpc_train {

// --augment, --resident-data, --cuda-graph: the program decides (auto), or the user forces it.
enum class Switch { kAuto, kOn, kOff };
// --optimizer: AdamW (decoupled weight decay), Adam (weight decay as an L2 gradient term), SGD
// with momentum, and the layer-wise adaptive rules: LAMB (Adam's moments) and LARS (SGD's
// momentum), each scaled by a per-parameter trust ratio (optimizer.h).
enum class OptimizerKind { kAdamW, kAdam, kSgd, kLamb, kLars };
// --lamb-bias-correction (LambBiasCorrection, trust_ratio.h): where LAMB corrects the moments'
// bias (Note [Trust ratios] in optimizer.h): in the moments (the paper's rule), in the step size
// (DeepSpeed's FusedLamb), or nowhere (FusedLamb's bias_correction false).
// --precision: the model's dtype (the master weights and Adam's moments are fp32 in every case).
enum class Precision { kFp32, kFp16, kBf16 };
// --device: where the ranks compute; placement.h decides auto.
enum class DeviceChoice { kAuto, kCuda, kCpu };
// --backend: what was asked for; placement.h resolves it into a CommBackendKind (comm.h).
enum class BackendChoice { kAuto, kNccl, kMpi, kNone };
// --progress: a bar when stdout is a terminal (auto), or always one of the two.
enum class ProgressStyle { kAuto, kBar, kLines };
// --data-store: the train split read from the dataset for every batch (file), or read once into
// host memory and exchanged between the ranks (memory; sample_store.h).
enum class DataStore { kFile, kMemory };
// --grad-accum-dtype, --comm-dtype: gradients added up across micro-steps, and summed across
// ranks, in the model's dtype or in fp32 (Note [Gradient precision] in flat_parameters.h).
enum class GradientDtype { kModel, kFp32 };

template <class Choice>
struct ChoiceName {
  Choice value;
  const char* name;
};

// ChoiceNames<Choice>::kTable: the table of one enum (Note [Choice names]).
template <class Choice>
struct ChoiceNames;

template <>
struct ChoiceNames<Switch> {
  static constexpr ChoiceName<Switch> kTable[] = {
      {Switch::kAuto, "auto"}, {Switch::kOn, "on"}, {Switch::kOff, "off"}};
};
template <>
struct ChoiceNames<OptimizerKind> {
  static constexpr ChoiceName<OptimizerKind> kTable[] = {{OptimizerKind::kAdamW, "adamw"},
                                                         {OptimizerKind::kAdam, "adam"},
                                                         {OptimizerKind::kSgd, "sgd"},
                                                         {OptimizerKind::kLamb, "lamb"},
                                                         {OptimizerKind::kLars, "lars"}};
};
// Whether `kind` keeps Adam's two moments per parameter (adamw, adam, lamb), rather than a
// momentum buffer (sgd, lars), which --momentum, --dampening and --nesterov configure.
inline bool keeps_adam_moments(OptimizerKind kind) {
  return kind == OptimizerKind::kAdamW || kind == OptimizerKind::kAdam ||
         kind == OptimizerKind::kLamb;
}
// Whether a checkpoint of `saved`'s optimizer state resumes under `kind`: Adam's moments mean the
// same for adamw, adam and lamb; SGD's buffer sums gradients and LARS's sums ratio-scaled ones
// (Note [Trust ratios] in optimizer.h), of other sizes, so each resumes only its own.
inline bool shares_optimizer_state(OptimizerKind saved, OptimizerKind kind) {
  return saved == kind || (keeps_adam_moments(saved) && keeps_adam_moments(kind));
}
template <>
struct ChoiceNames<LambBiasCorrection> {
  static constexpr ChoiceName<LambBiasCorrection> kTable[] = {
      {LambBiasCorrection::kMoments, "moments"},
      {LambBiasCorrection::kStepSize, "step"},
      {LambBiasCorrection::kNone, "none"}};
};
template <>
struct ChoiceNames<LrScheduleKind> {
  static constexpr ChoiceName<LrScheduleKind> kTable[] = {
      {LrScheduleKind::kConstant, "constant"},
      {LrScheduleKind::kWarmup, "warmup"},
      {LrScheduleKind::kWarmupCosine, "warmup-cosine"},
      {LrScheduleKind::kWarmupDecay, "warmup-decay"},
      {LrScheduleKind::kOneCycle, "one-cycle"},
      {LrScheduleKind::kMultiStep, "multistep"}};
};
template <>
struct ChoiceNames<WarmupType> {
  static constexpr ChoiceName<WarmupType> kTable[] = {{WarmupType::kLinear, "linear"},
                                                      {WarmupType::kLog, "log"}};
};
template <>
struct ChoiceNames<Precision> {
  static constexpr ChoiceName<Precision> kTable[] = {
      {Precision::kFp32, "fp32"}, {Precision::kFp16, "fp16"}, {Precision::kBf16, "bf16"}};
};
template <>
struct ChoiceNames<DeviceChoice> {
  static constexpr ChoiceName<DeviceChoice> kTable[] = {
      {DeviceChoice::kAuto, "auto"}, {DeviceChoice::kCuda, "cuda"}, {DeviceChoice::kCpu, "cpu"}};
};
template <>
struct ChoiceNames<BackendChoice> {
  static constexpr ChoiceName<BackendChoice> kTable[] = {{BackendChoice::kAuto, "auto"},
                                                         {BackendChoice::kNccl, "nccl"},
                                                         {BackendChoice::kMpi, "mpi"},
                                                         {BackendChoice::kNone, "none"}};
};
template <>
struct ChoiceNames<ProgressStyle> {
  static constexpr ChoiceName<ProgressStyle> kTable[] = {{ProgressStyle::kAuto, "auto"},
                                                         {ProgressStyle::kBar, "bar"},
                                                         {ProgressStyle::kLines, "lines"}};
};
template <>
struct ChoiceNames<DataStore> {
  static constexpr ChoiceName<DataStore> kTable[] = {{DataStore::kFile, "file"},
                                                     {DataStore::kMemory, "memory"}};
};

template <>
struct ChoiceNames<GradientDtype> {
  static constexpr ChoiceName<GradientDtype> kTable[] = {{GradientDtype::kModel, "model"},
                                                         {GradientDtype::kFp32, "fp32"}};
};

// Whether T is one of the enums above (it has a table).
template <class T, class = void>
struct is_choice : std::false_type {};
template <class T>
struct is_choice<T, std::void_t<decltype(ChoiceNames<T>::kTable)>> : std::true_type {};
template <class T>
inline constexpr bool is_choice_v = is_choice<T>::value;

// The name of `value`, e.g. "fp16". Error for a value outside the table (an integer cast to the
// enum: a bug, not an input).
template <class Choice, std::enable_if_t<is_choice_v<Choice>, int> = 0>
std::string to_string(Choice value) {
  for (const ChoiceName<Choice>& entry : ChoiceNames<Choice>::kTable) {
    if (entry.value == value) return entry.name;
  }
  throw Error("to_string: no name for choice value " +
              std::to_string(static_cast<std::underlying_type_t<Choice>>(value)));
}

// The value named `name` (exactly: names are lower case), or nullopt when none has that name.
// The configuration's readers turn nullopt into a ConfigError that names the option, the value
// and choice_names<Choice>().
template <class Choice, std::enable_if_t<is_choice_v<Choice>, int> = 0>
std::optional<Choice> parse_choice(std::string_view name) {
  for (const ChoiceName<Choice>& entry : ChoiceNames<Choice>::kTable) {
    if (name == entry.name) return entry.value;
  }
  return std::nullopt;
}

// Words as a message lists them: "a", "a or b", "a, b or c".
inline std::string or_list(const std::vector<std::string>& words) {
  std::string text;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i > 0) text += i + 1 == words.size() ? " or " : ", ";
    text += words[i];
  }
  return text;
}

// The names of the values `keep` holds for, as a message lists them (or_list).
template <class Choice, class Keep, std::enable_if_t<is_choice_v<Choice>, int> = 0>
std::string choice_names(const Keep& keep) {
  std::vector<std::string> names;
  for (const ChoiceName<Choice>& entry : ChoiceNames<Choice>::kTable)
    if (keep(entry.value)) names.push_back(entry.name);
  return or_list(names);
}

// All the names: "fp32, fp16 or bf16".
template <class Choice, std::enable_if_t<is_choice_v<Choice>, int> = 0>
std::string choice_names() {
  return choice_names<Choice>([](Choice) { return true; });
}

}  // namespace hpc_train

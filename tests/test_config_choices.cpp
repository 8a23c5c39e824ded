// The choices' name tables (config_choices.h): every value has the name that the command line,
// INI files, logs and checkpoints use (Note [Choice names]: the names are file formats, so they
// are spelled out here, not read from the tables), each name reads back to its value, and
// nothing else reads as a value.
#include <gtest/gtest.h>

#include <cctype>
#include <iterator>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "hpc_train/config/config_choices.h"
#include "hpc_train/error.h"

namespace hpc_train {
namespace {

template <class Choice>
void expect_names(const std::vector<std::pair<Choice, std::string>>& expected,
                  const std::string& listed) {
  // The table has exactly these values, each once.
  ASSERT_EQ(std::size(ChoiceNames<Choice>::kTable), expected.size());
  std::set<std::string> names;
  for (const auto& [value, name] : expected) {
    EXPECT_EQ(to_string(value), name);
    EXPECT_EQ(parse_choice<Choice>(name), value) << name;
    names.insert(name);
  }
  EXPECT_EQ(names.size(), expected.size()) << listed;
  EXPECT_EQ(choice_names<Choice>(), listed);
  // Names are exact: no other case, no blanks, nothing more or less, no empty name.
  for (const auto& [value, name] : expected) {
    std::string upper = name;
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    EXPECT_EQ(parse_choice<Choice>(upper), std::nullopt) << upper;
    EXPECT_EQ(parse_choice<Choice>(" " + name), std::nullopt) << name;
    EXPECT_EQ(parse_choice<Choice>(name + "x"), std::nullopt) << name;
    // A prefix may name another value ("adam" of "adamw"), never this one.
    EXPECT_NE(parse_choice<Choice>(name.substr(0, name.size() - 1)), value) << name;
  }
  EXPECT_EQ(parse_choice<Choice>(""), std::nullopt);
  EXPECT_EQ(parse_choice<Choice>("bogus"), std::nullopt);
}

TEST(ConfigChoices, EveryValueHasItsNameAndReadsBack) {
  expect_names<Switch>({{Switch::kAuto, "auto"}, {Switch::kOn, "on"}, {Switch::kOff, "off"}},
                       "auto, on or off");
  expect_names<OptimizerKind>({{OptimizerKind::kAdamW, "adamw"},
                               {OptimizerKind::kAdam, "adam"},
                               {OptimizerKind::kSgd, "sgd"},
                               {OptimizerKind::kLamb, "lamb"},
                               {OptimizerKind::kLars, "lars"}},
                              "adamw, adam, sgd, lamb or lars");
  expect_names<LambBiasCorrection>({{LambBiasCorrection::kMoments, "moments"},
                                    {LambBiasCorrection::kStepSize, "step"},
                                    {LambBiasCorrection::kNone, "none"}},
                                   "moments, step or none");
  expect_names<LrScheduleKind>({{LrScheduleKind::kConstant, "constant"},
                                {LrScheduleKind::kWarmup, "warmup"},
                                {LrScheduleKind::kWarmupCosine, "warmup-cosine"},
                                {LrScheduleKind::kWarmupDecay, "warmup-decay"},
                                {LrScheduleKind::kOneCycle, "one-cycle"},
                                {LrScheduleKind::kMultiStep, "multistep"}},
                               "constant, warmup, warmup-cosine, warmup-decay, one-cycle or "
                               "multistep");
  expect_names<WarmupType>({{WarmupType::kLinear, "linear"}, {WarmupType::kLog, "log"}},
                           "linear or log");
  expect_names<Precision>(
      {{Precision::kFp32, "fp32"}, {Precision::kFp16, "fp16"}, {Precision::kBf16, "bf16"}},
      "fp32, fp16 or bf16");
  expect_names<DeviceChoice>({{DeviceChoice::kAuto, "auto"},
                              {DeviceChoice::kCuda, "cuda"},
                              {DeviceChoice::kCpu, "cpu"}},
                             "auto, cuda or cpu");
  expect_names<BackendChoice>({{BackendChoice::kAuto, "auto"},
                               {BackendChoice::kNccl, "nccl"},
                               {BackendChoice::kMpi, "mpi"},
                               {BackendChoice::kNone, "none"}},
                              "auto, nccl, mpi or none");
  expect_names<ProgressStyle>({{ProgressStyle::kAuto, "auto"},
                               {ProgressStyle::kBar, "bar"},
                               {ProgressStyle::kLines, "lines"}},
                              "auto, bar or lines");
  expect_names<DataStore>({{DataStore::kFile, "file"}, {DataStore::kMemory, "memory"}},
                          "file or memory");
  expect_names<GradientDtype>({{GradientDtype::kModel, "model"}, {GradientDtype::kFp32, "fp32"}},
                              "model or fp32");
}

// The names of one enum say nothing about another's: "adam" is no precision.
TEST(ConfigChoices, NamesBelongToTheirEnum) {
  EXPECT_EQ(parse_choice<Precision>("adam"), std::nullopt);
  EXPECT_EQ(parse_choice<Switch>("cuda"), std::nullopt);
  EXPECT_EQ(parse_choice<BackendChoice>("cpu"), std::nullopt);
  EXPECT_EQ(parse_choice<ProgressStyle>("on"), std::nullopt);
  EXPECT_EQ(parse_choice<LambBiasCorrection>("lamb"), std::nullopt);
}

// A value that no table row names can only come from an integer cast to the enum: a bug, which
// to_string reports rather than printing a wrong name.
TEST(ConfigChoices, ValueOutsideTheTableIsAnError) {
  try {
    to_string(static_cast<Precision>(7));
    ADD_FAILURE() << "no Error";
  } catch (const ConfigError&) {
    ADD_FAILURE() << "a ConfigError: the user gave nothing wrong";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "to_string: no name for choice value 7");
  }
}

}  // namespace
}  // namespace hpc_train

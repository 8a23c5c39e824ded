// The DeepSpeed ds_config.json importer: the origin's file at 1, 2 and 3 ranks (world sizes are
// passed directly, no MPI needed), every mapped key, DeepSpeed's batch derivations and the batch
// identity's messages, unknown keys, JSON type errors, unsupported values, and the precedence of
// the command line.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "hpc_train/config/config.h"
#include "hpc_train/config/deepspeed_config.h"
#include "hpc_train/error.h"

namespace hpc_train {
namespace {

namespace fs = std::filesystem;

const std::string kConfigsDir = HPC_TRAIN_CONFIGS_DIR;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

bool any_contains(const std::vector<std::string>& texts, const std::string& part) {
  for (const std::string& text : texts) {
    if (contains(text, part)) return true;
  }
  return false;
}

std::string joined(const std::vector<std::string>& texts) {
  std::string all;
  for (const std::string& text : texts) all += text + "\n";
  return all;
}

class DeepSpeedConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "hpc_train_test_ds_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  std::string write(const std::string& text, const std::string& name = "ds_config.json") {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  // Applies `json` to `config` (defaults unless given) at `world_size` ranks.
  std::vector<std::string> apply(const std::string& json, int world_size,
                                 TrainConfig& config,
                                 const std::set<std::string>& given = {},
                                 bool allow_unknown = false) {
    DeepSpeedImport import;
    import.path = write(json);
    import.allow_unknown_keys = allow_unknown;
    return apply_deepspeed_config(import, world_size, given, config);
  }
  // The ConfigError message of applying `json`, or a failure when it applies.
  std::string error(const std::string& json, int world_size = 1,
                    const std::set<std::string>& given = {}, TrainConfig config = {}) {
    try {
      apply(json, world_size, config, given);
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.exit_code(), kExitUsageError);
      return e.what();
    }
    ADD_FAILURE() << "no ConfigError for " << json;
    return "";
  }
  fs::path dir_;
};

TrainConfig apply_file(const std::string& path, int world_size,
                       std::vector<std::string>* warnings = nullptr) {
  TrainConfig config;
  DeepSpeedImport import;
  import.path = path;
  std::vector<std::string> got = apply_deepspeed_config(import, world_size, {}, config);
  if (warnings) *warnings = got;
  return config;
}

void expect_origin_recipe(const TrainConfig& c) {
  EXPECT_EQ(c.grad_accum, 1);
  EXPECT_EQ(c.precision, Precision::kFp16);
  EXPECT_EQ(c.optimizer, OptimizerKind::kAdamW);  // DeepSpeed's "Adam" is AdamW unless adam_w_mode is false
  EXPECT_EQ(c.lr, 1e-3);
  EXPECT_EQ(c.beta1, 0.9);
  EXPECT_EQ(c.beta2, 0.999);
  EXPECT_EQ(c.eps, 1e-8);
  EXPECT_EQ(c.weight_decay, 0.01);
  EXPECT_EQ(c.zero_stage, 2);
  EXPECT_EQ(c.loss_scale, 0.0);  // dynamic, DeepSpeed's defaults
  EXPECT_EQ(c.initial_scale_power, 16);
  EXPECT_EQ(c.loss_scale_window, 1000);
  EXPECT_EQ(c.hysteresis, 2);
  EXPECT_EQ(c.min_loss_scale, 1.0);
}

TEST(DeepSpeedConfig, OriginConfigAtOneAndTwoRanks) {
  const std::string path = kConfigsDir + "/ds_origin.json";
  std::vector<std::string> warnings;
  const TrainConfig one = apply_file(path, 1, &warnings);
  EXPECT_EQ(one.micro_batch, 64);
  expect_origin_recipe(one);
  EXPECT_TRUE(warnings.empty()) << joined(warnings);

  const TrainConfig two = apply_file(path, 2, &warnings);
  EXPECT_EQ(two.micro_batch, 32);
  expect_origin_recipe(two);
  EXPECT_TRUE(warnings.empty()) << joined(warnings);

  EXPECT_EQ(apply_file(path, 4).micro_batch, 16);
}

TEST(DeepSpeedConfig, OriginConfigAtThreeRanksSaysWhatWorks) {
  const std::string path = kConfigsDir + "/ds_origin.json";
  TrainConfig config;
  config.lr = 0.5;  // a failed import leaves the configuration alone
  DeepSpeedImport import;
  import.path = path;
  try {
    apply_deepspeed_config(import, 3, {}, config);
    FAIL() << "no ConfigError at 3 ranks";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              path +
                  ": train_batch_size 64 must equal train_micro_batch_size_per_gpu x "
                  "gradient_accumulation_steps x world size (21 x 1 x 3 = 63 with 3 ranks). "
                  "With 3 ranks use a train_batch_size divisible by 3, e.g. 63 or 66 (or 192 "
                  "for micro-batch 64); or run 64 on 1, 2 or 4 ranks (any divisor of 64)");
  }
  EXPECT_EQ(config.lr, 0.5);
  EXPECT_EQ(config.micro_batch, 64);

  const TrainConfig three = apply_file(kConfigsDir + "/ds_origin_3ranks.json", 3);
  EXPECT_EQ(three.micro_batch, 64);
  expect_origin_recipe(three);
}

TEST_F(DeepSpeedConfigTest, EveryMappedKey) {
  TrainConfig config;
  const std::vector<std::string> warnings = apply(R"({
    "train_batch_size": 96,
    "train_micro_batch_size_per_gpu": 16,
    "gradient_accumulation_steps": 3,
    "optimizer": {"type": "AdamW",
                  "params": {"lr": 3e-4, "betas": [0.8, 0.95], "eps": 1e-6,
                             "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupCosineLR",
                  "params": {"total_num_steps": 5000, "warmup_min_ratio": 0.05,
                             "warmup_num_steps": 200, "cos_min_ratio": 0.02,
                             "warmup_type": "linear"}},
    "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
             "loss_scale_window": 500, "hysteresis": 3, "min_loss_scale": 0.25,
             "consecutive_hysteresis": false, "auto_cast": false},
    "bf16": {"enabled": false},
    "zero_optimization": {"stage": 1, "reduce_bucket_size": 2e8,
                          "allgather_bucket_size": 2e8, "overlap_comm": false,
                          "contiguous_gradients": true, "reduce_scatter": true,
                          "allgather_partitions": true,
                          "offload_optimizer": {"device": "none"}},
    "gradient_clipping": 1.5,
    "steps_per_print": 25
  })", 2, config);
  EXPECT_TRUE(warnings.empty()) << joined(warnings);
  EXPECT_EQ(config.micro_batch, 16);
  EXPECT_EQ(config.grad_accum, 3);
  EXPECT_EQ(config.optimizer, OptimizerKind::kAdamW);
  EXPECT_EQ(config.lr, 3e-4);
  EXPECT_EQ(config.beta1, 0.8);
  EXPECT_EQ(config.beta2, 0.95);
  EXPECT_EQ(config.eps, 1e-6);
  EXPECT_EQ(config.weight_decay, 0.1);
  EXPECT_EQ(config.lr_schedule, LrScheduleKind::kWarmupCosine);
  EXPECT_EQ(config.schedule_steps, 5000);
  EXPECT_EQ(config.warmup_steps, 200);
  EXPECT_EQ(config.warmup_start_ratio, 0.05);
  EXPECT_EQ(config.cosine_final_ratio, 0.02);
  EXPECT_EQ(config.warmup_type, WarmupType::kLinear);
  EXPECT_EQ(config.precision, Precision::kFp16);
  EXPECT_EQ(config.loss_scale, 0.0);
  EXPECT_EQ(config.initial_scale_power, 12);
  EXPECT_EQ(config.loss_scale_window, 500);
  EXPECT_EQ(config.hysteresis, 3);
  EXPECT_EQ(config.min_loss_scale, 0.25);
  EXPECT_EQ(config.zero_stage, 1);
  EXPECT_EQ(config.bucket_mb, 2e8 * 2 / (1024.0 * 1024.0));  // fp16: 2 bytes per element
  EXPECT_FALSE(config.overlap_comm);
  EXPECT_EQ(config.clip_grad, 1.5);
  EXPECT_EQ(config.log_every, 25);
  EXPECT_NO_THROW(validate(config));

  // The resolved run is still fully described by to_ini: it reads back identically.
  const std::string ini = write(to_ini(config), "resolved.ini");
  const std::string args[] = {"hpc_train", "--config", ini};
  const char* argv[] = {args[0].c_str(), args[1].c_str(), args[2].c_str()};
  EXPECT_EQ(to_ini(parse_command_line(3, argv).config), to_ini(config));
}

TEST_F(DeepSpeedConfigTest, WarmupLr) {
  TrainConfig config;
  apply(R"({"train_batch_size": 8,
            "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
            "scheduler": {"type": "WarmupLR",
                          "params": {"warmup_min_lr": 0.001, "warmup_max_lr": 0.01,
                                     "warmup_num_steps": 500, "last_batch_iteration": -1}}})",
        1, config);
  EXPECT_EQ(config.lr_schedule, LrScheduleKind::kWarmup);
  EXPECT_EQ(config.lr, 0.01);
  EXPECT_DOUBLE_EQ(config.warmup_start_ratio, 0.1);
  EXPECT_EQ(config.warmup_steps, 500);
  EXPECT_EQ(config.warmup_type, WarmupType::kLog);  // DeepSpeed's default

  // warmup_max_lr replaces the optimizer's lr (said in a warning); a warm-up of fewer than 2
  // steps becomes 2, as in DeepSpeed.
  TrainConfig other;
  const std::vector<std::string> warnings =
      apply(R"({"train_batch_size": 8,
                "optimizer": {"type": "Adam", "params": {"lr": 0.5}},
                "scheduler": {"type": "WarmupLR",
                              "params": {"warmup_max_lr": 0.02, "warmup_num_steps": 1,
                                         "warmup_type": "linear"}}})",
            1, other);
  EXPECT_EQ(other.lr, 0.02);
  EXPECT_EQ(other.warmup_start_ratio, 0.0);
  EXPECT_EQ(other.warmup_steps, 2);
  EXPECT_EQ(other.warmup_type, WarmupType::kLinear);
  EXPECT_TRUE(any_contains(warnings, "'optimizer.params.lr' 0.5 is replaced by "
                                     "'scheduler.params.warmup_max_lr' 0.02"))
      << joined(warnings);
  EXPECT_TRUE(any_contains(warnings, "'scheduler.params.warmup_num_steps' 1 becomes 2"))
      << joined(warnings);

  // Without warmup_max_lr, the warm-up rises to the optimizer's lr (current DeepSpeed).
  TrainConfig to_optimizer_lr;
  apply(R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lr": 0.004}},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.001}}})",
        1, to_optimizer_lr);
  EXPECT_EQ(to_optimizer_lr.lr, 0.004);
  EXPECT_DOUBLE_EQ(to_optimizer_lr.warmup_start_ratio, 0.25);
  EXPECT_EQ(to_optimizer_lr.warmup_steps, 1000);
}

TEST_F(DeepSpeedConfigTest, WarmupCosineDefaultsAndErrors) {
  TrainConfig config;
  apply(R"({"train_batch_size": 8,
            "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 3000}}})",
        1, config);
  EXPECT_EQ(config.lr_schedule, LrScheduleKind::kWarmupCosine);
  EXPECT_EQ(config.schedule_steps, 3000);
  EXPECT_EQ(config.warmup_steps, 1000);
  EXPECT_EQ(config.warmup_type, WarmupType::kLog);
  EXPECT_EQ(config.warmup_start_ratio, 0.0);
  EXPECT_EQ(config.cosine_final_ratio, 0.0001);

  EXPECT_TRUE(contains(error(R"({"train_batch_size": 8,
      "scheduler": {"type": "WarmupCosineLR", "params": {}}})"),
                       "WarmupCosineLR needs 'scheduler.params.total_num_steps'"));
  const std::string shorter = error(R"({"train_batch_size": 8,
      "scheduler": {"type": "WarmupCosineLR",
                    "params": {"total_num_steps": 100, "warmup_num_steps": 500}}})");
  EXPECT_TRUE(contains(shorter, ": 'scheduler.params.total_num_steps' gives --schedule-steps "
                                "100: the cosine would end before the warm-up"))
      << shorter;
  std::string message = error(R"({"train_batch_size": 8, "scheduler": {"type": "CyclicLR"}})");
  EXPECT_TRUE(contains(message, "'scheduler.type' \"CyclicLR\" is not supported")) << message;
  message = error(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
                      "params": {"warmup_type": "cubic"}}})");
  EXPECT_TRUE(contains(message, "'scheduler.params.warmup_type' \"cubic\"")) << message;
  message = error(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
                      "params": {"warmup_min_lr": 0.1, "warmup_max_lr": 0.01}}})");
  EXPECT_TRUE(contains(message, "'scheduler.params.warmup_min_lr' 0.1 must be in [0, 0.01]"))
      << message;
  message = error(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
                      "params": {"last_batch_iteration": 100}}})");
  EXPECT_TRUE(contains(message, "last_batch_iteration")) << message;
}

// WarmupDecayLR: WarmupLR's params and the step where the decay ends.
TEST_F(DeepSpeedConfigTest, WarmupDecayLr) {
  TrainConfig config;
  apply(R"({"train_batch_size": 8,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
            "scheduler": {"type": "WarmupDecayLR",
                          "params": {"total_num_steps": 5000, "warmup_min_lr": 0.001,
                                     "warmup_max_lr": 0.02, "warmup_num_steps": 300,
                                     "warmup_type": "linear"}}})",
        1, config);
  EXPECT_EQ(config.lr_schedule, LrScheduleKind::kWarmupDecay);
  EXPECT_EQ(config.lr, 0.02);
  EXPECT_DOUBLE_EQ(config.warmup_start_ratio, 0.05);
  EXPECT_EQ(config.warmup_steps, 300);
  EXPECT_EQ(config.warmup_type, WarmupType::kLinear);
  EXPECT_EQ(config.schedule_steps, 5000);
  EXPECT_NO_THROW(validate(config));
  const std::string message = error(R"({"train_batch_size": 8,
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}})");
  EXPECT_TRUE(contains(message, "WarmupDecayLR needs 'scheduler.params.total_num_steps'"))
      << message;
}

// OneCycle: the peak replaces the optimizer's lr, the minimum becomes a fraction of it, DeepSpeed's
// defaults for what is left out, and Adam's beta2 0.99 while beta1 cycles.
TEST_F(DeepSpeedConfigTest, OneCycle) {
  TrainConfig config;
  const std::vector<std::string> warnings =
      apply(R"({"train_batch_size": 8,
                "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "betas": [0.9, 0.999]}},
                "scheduler": {"type": "OneCycle",
                              "params": {"cycle_min_lr": 0.002, "cycle_max_lr": 0.04,
                                         "cycle_first_step_size": 300,
                                         "cycle_first_stair_count": 4}}})",
            1, config);
  EXPECT_EQ(config.lr_schedule, LrScheduleKind::kOneCycle);
  EXPECT_EQ(config.lr, 0.04);
  EXPECT_DOUBLE_EQ(config.cycle_min_ratio, 0.05);
  EXPECT_EQ(config.cycle_first_steps, 300);
  EXPECT_EQ(config.cycle_second_steps, 0);  // as many as up
  EXPECT_EQ(config.cycle_decay_steps, 0);
  EXPECT_TRUE(config.cycle_momentum);
  EXPECT_EQ(config.cycle_min_momentum, 0.8);
  EXPECT_EQ(config.cycle_max_momentum, 0.9);
  EXPECT_EQ(config.beta2, 0.99);
  EXPECT_TRUE(any_contains(warnings, "'optimizer.params.betas[1]' 0.999 becomes 0.99"))
      << joined(warnings);
  EXPECT_TRUE(any_contains(warnings, "cycle_first_stair_count' is accepted and has no effect"))
      << joined(warnings);
  EXPECT_NO_THROW(validate(config));

  TrainConfig sgd;
  apply(R"({"train_batch_size": 8,
            "optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}},
            "scheduler": {"type": "OneCycle",
                          "params": {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1,
                                     "cycle_first_step_size": 100, "cycle_second_step_size": 200,
                                     "decay_step_size": 10, "decay_lr_rate": 0.5,
                                     "cycle_momentum": false}}})",
        1, sgd);
  EXPECT_EQ(sgd.cycle_second_steps, 200);
  EXPECT_EQ(sgd.cycle_decay_steps, 10);
  EXPECT_EQ(sgd.cycle_decay_lr_rate, 0.5);
  EXPECT_FALSE(sgd.cycle_momentum);
  EXPECT_EQ(sgd.beta2, 0.999);  // untouched: nothing cycles

  // FusedLamb has betas: OneCycle cycles its beta1, as Adam's. LARS (the command line's: no
  // DeepSpeed type) cycles its momentum, as SGD.
  const std::string one_cycle = R"("scheduler": {"type": "OneCycle",
      "params": {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1}})";
  TrainConfig lamb;
  apply(R"({"train_batch_size": 8, "optimizer": {"type": "Lamb"}, )" + one_cycle + "}", 1, lamb);
  EXPECT_EQ(lamb.beta2, 0.99);
  TrainConfig lars;
  lars.optimizer = OptimizerKind::kLars;
  lars.momentum = 0.9;
  const std::vector<std::string> lars_warnings =
      apply(R"({"train_batch_size": 8, )" + one_cycle + "}", 1, lars, {"optimizer"});
  EXPECT_EQ(lars.beta2, 0.999);
  EXPECT_TRUE(any_contains(lars_warnings, "DeepSpeed cycles only betas and leaves the momentum "
                                          "of lars alone, hpc_train cycles it"))
      << joined(lars_warnings);
  EXPECT_NO_THROW(validate(lars));
  std::string message = error(R"({"train_batch_size": 8,
      "scheduler": {"type": "OneCycle", "params": {"cycle_max_lr": 0.1}}})");
  EXPECT_TRUE(contains(message, "OneCycle needs 'scheduler.params.cycle_min_lr'")) << message;
  message = error(R"({"train_batch_size": 8, "scheduler": {"type": "OneCycle",
      "params": {"cycle_min_lr": 0.5, "cycle_max_lr": 0.1}}})");
  EXPECT_TRUE(contains(message, "'scheduler.params.cycle_min_lr' 0.5 must be in [0, 0.1]"))
      << message;
}

TEST_F(DeepSpeedConfigTest, OptimizerTypes) {
  const auto optimizer_of = [&](const std::string& optimizer) {
    TrainConfig config;
    apply(R"({"train_batch_size": 8, "optimizer": )" + optimizer + "}", 1, config);
    return config;
  };
  EXPECT_EQ(optimizer_of(R"({"type": "Adam"})").optimizer, OptimizerKind::kAdamW);
  EXPECT_EQ(optimizer_of(R"({"type": "adam"})").optimizer, OptimizerKind::kAdamW);  // case-insensitive
  EXPECT_EQ(optimizer_of(R"({"type": "Adam", "params": {"adam_w_mode": false}})").optimizer,
            OptimizerKind::kAdam);
  EXPECT_EQ(optimizer_of(R"({"type": "AdamW"})").optimizer, OptimizerKind::kAdamW);
  TrainConfig config;
  const std::vector<std::string> warnings = apply(
      R"({"train_batch_size": 8,
          "optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})",
      1, config);
  EXPECT_EQ(config.optimizer, OptimizerKind::kAdamW);
  EXPECT_TRUE(any_contains(warnings, "'optimizer.params.adam_w_mode' false has no effect"));

  // A block present means DeepSpeed's defaults for what it leaves out: FusedAdam's weight decay
  // is 0 (hpc_train's own default is 0.01), torch.optim.AdamW's is 0.01.
  const TrainConfig fused = optimizer_of(R"({"type": "Adam", "params": {"lr": 0.002}})");
  EXPECT_EQ(fused.weight_decay, 0.0);
  EXPECT_EQ(fused.lr, 0.002);
  EXPECT_EQ(fused.eps, 1e-8);
  EXPECT_EQ(optimizer_of(R"({"type": "AdamW", "params": {"torch_adam": true}})").weight_decay,
            0.01);

  // "SGD" is torch.optim.SGD, with its defaults (weight decay 0).
  const TrainConfig sgd = optimizer_of(
      R"({"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": true}})");
  EXPECT_EQ(sgd.optimizer, OptimizerKind::kSgd);
  EXPECT_EQ(sgd.lr, 0.1);
  EXPECT_EQ(sgd.momentum, 0.9);
  EXPECT_TRUE(sgd.nesterov);
  EXPECT_EQ(sgd.dampening, 0.0);
  EXPECT_EQ(sgd.weight_decay, 0.0);
  EXPECT_NO_THROW(validate(sgd));
  EXPECT_TRUE(contains(error(R"({"train_batch_size": 8,
                                 "optimizer": {"type": "SGD", "params": {"betas": [0.9, 0.99]}}})"),
                       "betas"));

  std::string message = error(R"({"train_batch_size": 8, "optimizer": {"type": "OneBitLamb"}})");
  EXPECT_TRUE(contains(message, "'optimizer.type' \"OneBitLamb\" is not supported: hpc_train "
                                "runs \"Adam\" (AdamW unless params.adam_w_mode is false, as in "
                                "DeepSpeed), \"AdamW\", \"SGD\" and \"Lamb\""))
      << message;
  message = error(R"({"train_batch_size": 8, "optimizer": {"params": {"lr": 1}}})");
  EXPECT_TRUE(contains(message, "'optimizer' has no 'type'")) << message;
  message = error(R"({"train_batch_size": 8,
                      "optimizer": {"type": "Adam", "params": {"max_grad_norm": 1.0}}})");
  EXPECT_TRUE(contains(message, "gradient_clipping")) << message;
  message = error(R"({"train_batch_size": 8,
                      "optimizer": {"type": "Adam", "params": {"betas": [0.9]}}})");
  EXPECT_TRUE(contains(message, "'optimizer.params.betas' must be an array of two numbers"))
      << message;
}

// "Lamb" is DeepSpeed's FusedLamb: Adam's params and defaults, the trust ratio bounded to
// [min_coeff, max_coeff] = [0.01, 10] by default, the bias corrected in the step size.
TEST_F(DeepSpeedConfigTest, Lamb) {
  TrainConfig defaults;
  std::vector<std::string> warnings =
      apply(R"({"train_batch_size": 8, "optimizer": {"type": "Lamb"}})", 1, defaults);
  EXPECT_TRUE(warnings.empty()) << joined(warnings);
  EXPECT_EQ(defaults.optimizer, OptimizerKind::kLamb);
  EXPECT_EQ(defaults.lr, 1e-3);
  EXPECT_EQ(defaults.beta1, 0.9);
  EXPECT_EQ(defaults.beta2, 0.999);
  EXPECT_EQ(defaults.eps, 1e-8);
  EXPECT_EQ(defaults.weight_decay, 0.0);  // FusedLamb's, not hpc_train's 0.01
  EXPECT_EQ(defaults.min_trust_ratio, 0.01);
  EXPECT_EQ(defaults.max_trust_ratio, 10.0);
  EXPECT_EQ(defaults.lamb_bias_correction, LambBiasCorrection::kStepSize);
  EXPECT_NO_THROW(validate(defaults));

  TrainConfig config;  // every key; the type in any case
  warnings = apply(R"({"train_batch_size": 8,
      "optimizer": {"type": "LAMB",
                    "params": {"lr": 0.002, "betas": [0.8, 0.99], "eps": 1e-6,
                               "weight_decay": 0.01, "max_coeff": 0.3, "min_coeff": 0.08,
                               "bias_correction": false, "eps_inside_sqrt": false,
                               "amsgrad": false}}})",
                   1, config);
  EXPECT_TRUE(warnings.empty()) << joined(warnings);
  EXPECT_EQ(config.optimizer, OptimizerKind::kLamb);
  EXPECT_EQ(config.lr, 0.002);
  EXPECT_EQ(config.beta1, 0.8);
  EXPECT_EQ(config.beta2, 0.99);
  EXPECT_EQ(config.eps, 1e-6);
  EXPECT_EQ(config.weight_decay, 0.01);
  EXPECT_EQ(config.max_trust_ratio, 0.3);
  EXPECT_EQ(config.min_trust_ratio, 0.08);
  EXPECT_EQ(config.lamb_bias_correction, LambBiasCorrection::kNone);
  EXPECT_NO_THROW(validate(config));
  TrainConfig corrected;
  apply(R"({"train_batch_size": 8,
            "optimizer": {"type": "lamb", "params": {"bias_correction": true}}})",
        1, corrected);
  EXPECT_EQ(corrected.lamb_bias_correction, LambBiasCorrection::kStepSize);

  // What FusedLamb would compute otherwise, or DeepSpeed refuses.
  const auto lamb_error = [&](const std::string& params) {
    return error(R"({"train_batch_size": 8, "optimizer": {"type": "Lamb", "params": )" + params +
                 "}}");
  };
  std::string message = lamb_error(R"({"eps_inside_sqrt": true})");
  EXPECT_TRUE(contains(message, "'optimizer.params.eps_inside_sqrt' true is not supported"))
      << message;
  message = lamb_error(R"({"amsgrad": true})");
  EXPECT_TRUE(contains(message, "'optimizer.params.amsgrad' true is not supported")) << message;
  for (const char* norm : {"1.0", "0"}) {  // DeepSpeed's engine refuses the key at any value
    message = lamb_error(std::string(R"({"max_grad_norm": )") + norm + "}");
    EXPECT_TRUE(contains(message, "'optimizer.params.max_grad_norm' is not an optimizer "
                                  "parameter (DeepSpeed rejects it too); use the top-level "
                                  "\"gradient_clipping\""))
        << message;
  }
  message = lamb_error(R"({"max_coeff": 0})");
  EXPECT_TRUE(contains(message, "'optimizer.params.max_coeff' 0 must be > 0")) << message;
  message = lamb_error(R"({"min_coeff": 0.8, "max_coeff": 0.5})");
  EXPECT_TRUE(contains(message, "'optimizer.params.max_coeff' gives --max-trust-ratio 0.5: must "
                                "be 0 (no upper bound) or a finite number >= --min-trust-ratio "
                                "(0.8)"))
      << message;
  message = lamb_error(R"({"min_coeff": -1})");
  EXPECT_TRUE(contains(message, "'optimizer.params.min_coeff' gives --min-trust-ratio -1:"))
      << message;
  message = lamb_error(R"({"bias_correction": 1})");
  EXPECT_TRUE(contains(message, "'optimizer.params.bias_correction' must be true or false"))
      << message;
  message = lamb_error(R"({"adam_w_mode": false})");
  EXPECT_TRUE(contains(message, "unknown key 'optimizer.params.adam_w_mode'")) << message;
}

// --optimizer on the command line wins over the file's type: LAMB's own keys then mean nothing;
// with "type": "auto" the block's params are those of the command line's optimizer.
TEST_F(DeepSpeedConfigTest, LambAndTheCommandLinesOptimizer) {
  TrainConfig adamw;
  std::vector<std::string> warnings = apply(
      R"({"train_batch_size": 8,
          "optimizer": {"type": "Lamb", "params": {"max_coeff": 0.3, "weight_decay": 0.1}}})",
      1, adamw, {"optimizer"});
  EXPECT_EQ(adamw.optimizer, OptimizerKind::kAdamW);
  EXPECT_EQ(adamw.weight_decay, 0.1);
  EXPECT_EQ(adamw.max_trust_ratio, 0.0);
  EXPECT_EQ(adamw.min_trust_ratio, 0.0);
  EXPECT_EQ(adamw.lamb_bias_correction, LambBiasCorrection::kMoments);
  EXPECT_TRUE(any_contains(warnings, "'optimizer.type' lamb is not used: --optimizer adamw on "
                                     "the command line wins"))
      << joined(warnings);
  EXPECT_NO_THROW(validate(adamw));

  TrainConfig lamb;
  lamb.optimizer = OptimizerKind::kLamb;
  warnings = apply(R"({"train_batch_size": 8,
                       "optimizer": {"type": "auto",
                                     "params": {"max_coeff": 5, "bias_correction": "auto"}}})",
                   1, lamb, {"optimizer"});
  EXPECT_EQ(lamb.optimizer, OptimizerKind::kLamb);
  EXPECT_EQ(lamb.max_trust_ratio, 5.0);
  EXPECT_EQ(lamb.min_trust_ratio, 0.01);
  EXPECT_EQ(lamb.lamb_bias_correction, LambBiasCorrection::kMoments);  // "auto": ours
  EXPECT_TRUE(any_contains(warnings, "'optimizer.params.bias_correction' is \"auto\": "
                                     "--lamb-bias-correction moments"))
      << joined(warnings);

  TrainConfig lars;
  lars.optimizer = OptimizerKind::kLars;
  const std::string message = error(
      R"({"train_batch_size": 8, "optimizer": {"type": "auto", "params": {"lr": 0.1}}})", 1,
      {"optimizer"}, lars);
  EXPECT_TRUE(contains(message, "'optimizer.type' is \"auto\" and --optimizer is lars, which "
                                "DeepSpeed has no optimizer for"))
      << message;
}

TEST_F(DeepSpeedConfigTest, Precision) {
  TrainConfig config;
  apply(R"({"train_batch_size": 8, "bf16": {"enabled": true}})", 1, config);
  EXPECT_EQ(config.precision, Precision::kBf16);

  TrainConfig off;
  off.precision = Precision::kBf16;  // as if from the INI file
  apply(R"({"train_batch_size": 8, "fp16": {"enabled": false}})", 1, off);
  EXPECT_EQ(off.precision, Precision::kFp32);  // the file's block says: no mixed precision

  TrainConfig untouched;
  untouched.precision = Precision::kBf16;
  apply(R"({"train_batch_size": 8})", 1, untouched);
  EXPECT_EQ(untouched.precision, Precision::kBf16);  // no block: the INI/default value stays

  TrainConfig fixed;
  apply(R"({"train_batch_size": 8, "fp16": {"enabled": true, "loss_scale": 128}})", 1, fixed);
  EXPECT_EQ(fixed.loss_scale, 128.0);

  std::string message = error(
      R"({"train_batch_size": 8, "fp16": {"enabled": true}, "bf16": {"enabled": true}})");
  EXPECT_TRUE(contains(message, "fp16.enabled and bf16.enabled are both true")) << message;
  message = error(R"({"train_batch_size": 8,
                      "fp16": {"enabled": true, "consecutive_hysteresis": true}})");
  EXPECT_TRUE(contains(message, "consecutive_hysteresis")) << message;
  // Out-of-range values name the key that set them.
  message = error(R"({"train_batch_size": 8, "fp16": {"enabled": true, "hysteresis": 0}})");
  EXPECT_TRUE(contains(message, ": 'fp16.hysteresis' gives --hysteresis 0: must be at least 1"))
      << message;

  TrainConfig unused;
  const std::vector<std::string> warnings = apply(
      R"({"train_batch_size": 8, "bf16": {"enabled": true}, "fp16": {"loss_scale_window": 10}})",
      1, unused);
  EXPECT_TRUE(any_contains(warnings, "fp16.loss_scale_window take effect only with fp16"))
      << joined(warnings);
}

TEST_F(DeepSpeedConfigTest, ZeroOptimization) {
  std::string message = error(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3}})");
  EXPECT_TRUE(contains(message, "'zero_optimization.stage' 3: hpc_train supports ZeRO stages 0, "
                                "1 and 2"))
      << message;
  message = error(R"({"train_batch_size": 8,
                      "zero_optimization": {"offload_optimizer": {"device": "cpu"}}})");
  EXPECT_TRUE(contains(message, "'zero_optimization.offload_optimizer.device' \"cpu\" is not "
                                "supported"))
      << message;

  // reduce_bucket_size counts elements: 2 bytes each in fp16/bf16, 4 in fp32.
  TrainConfig fp32;
  apply(R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": 5e8}})", 1, fp32);
  EXPECT_EQ(fp32.precision, Precision::kFp32);
  EXPECT_EQ(fp32.bucket_mb, 5e8 * 4 / 1048576.0);
  TrainConfig fp16;
  apply(R"({"train_batch_size": 8, "fp16": {"enabled": true},
            "zero_optimization": {"reduce_bucket_size": 1048576}})",
        1, fp16);
  EXPECT_EQ(fp16.bucket_mb, 2.0);
  TrainConfig bf16_from_command_line;
  bf16_from_command_line.precision = Precision::kBf16;
  apply(R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": 524288}})", 1,
        bf16_from_command_line, {"precision"});
  EXPECT_EQ(bf16_from_command_line.bucket_mb, 1.0);

  TrainConfig kept;  // keys left out of zero_optimization keep hpc_train's values
  apply(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2}})", 1, kept);
  EXPECT_EQ(kept.zero_stage, 2);
  EXPECT_EQ(kept.bucket_mb, TrainConfig{}.bucket_mb);
  EXPECT_EQ(kept.overlap_comm, TrainConfig{}.overlap_comm);

  TrainConfig config;
  const std::vector<std::string> warnings =
      apply(R"({"train_batch_size": 8,
                "zero_optimization": {"stage": 2, "reduce_scatter": false,
                                      "contiguous_gradients": false,
                                      "reduce_bucket_size": 1000, "allgather_bucket_size": 2000}})",
            1, config);
  EXPECT_TRUE(any_contains(warnings, "'zero_optimization.reduce_scatter' false has no effect"))
      << joined(warnings);
  EXPECT_TRUE(any_contains(warnings, "'zero_optimization.contiguous_gradients' false"));
  EXPECT_TRUE(any_contains(warnings, "'zero_optimization.allgather_bucket_size' 2000 has no "
                                     "effect"));
}

// Note [Gradient precision]: data_types.grad_accum_dtype and communication_data_type map onto
// --grad-accum-dtype and --comm-dtype (they used to be refused): fp32, or the model's own dtype,
// under any of DeepSpeed's names for it; anything else is refused, naming the key and the value.
TEST_F(DeepSpeedConfigTest, GradientDtypes) {
  TrainConfig config;
  std::vector<std::string> warnings =
      apply(R"({"train_batch_size": 64, "gradient_accumulation_steps": 8,
                "bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp32"},
                "communication_data_type": "fp32"})",
            1, config);
  EXPECT_EQ(config.precision, Precision::kBf16);
  EXPECT_EQ(config.grad_accum, 8);
  EXPECT_EQ(config.grad_accum_dtype, GradientDtype::kFp32);
  EXPECT_EQ(config.comm_dtype, GradientDtype::kFp32);
  EXPECT_FALSE(any_contains(warnings, "data_types")) << joined(warnings);
  EXPECT_FALSE(any_contains(warnings, "communication_data_type")) << joined(warnings);

  // DeepSpeed's other names: DtypeEnum's for data_types (as written), any case for
  // communication_data_type; the model's own dtype is "model".
  const auto dtypes_of = [&](const std::string& precision_block, const std::string& accum,
                             const std::string& comm) {
    TrainConfig c;
    c.grad_accum_dtype = GradientDtype::kFp32;  // as if from the INI file: replaced
    c.comm_dtype = GradientDtype::kFp32;
    apply(R"({"train_batch_size": 8, )" + precision_block + R"(, "data_types": {"grad_accum_dtype": )" +
              accum + R"(}, "communication_data_type": )" + comm + "}",
          1, c);
    return std::make_pair(c.grad_accum_dtype, c.comm_dtype);
  };
  const std::string bf16 = R"("bf16": {"enabled": true})";
  const std::string fp16 = R"("fp16": {"enabled": true})";
  using D = GradientDtype;
  EXPECT_EQ(dtypes_of(bf16, R"("float32")", R"("FP32")"), std::make_pair(D::kFp32, D::kFp32));
  EXPECT_EQ(dtypes_of(bf16, R"("torch.float32")", R"("Fp32")"), std::make_pair(D::kFp32, D::kFp32));
  EXPECT_EQ(dtypes_of(bf16, R"("float")", R"("bf16")"), std::make_pair(D::kFp32, D::kModel));
  EXPECT_EQ(dtypes_of(bf16, R"("bfloat16")", R"("BF16")"), std::make_pair(D::kModel, D::kModel));
  EXPECT_EQ(dtypes_of(bf16, R"("torch.bfloat16")", R"("fp32")"), std::make_pair(D::kModel, D::kFp32));
  EXPECT_EQ(dtypes_of(fp16, R"("half")", R"("fp16")"), std::make_pair(D::kModel, D::kModel));
  EXPECT_EQ(dtypes_of(fp16, R"("float16")", R"("fp32")"), std::make_pair(D::kModel, D::kFp32));
  // null (DeepSpeed's "not set") keeps the INI file's or the default value.
  EXPECT_EQ(dtypes_of(bf16, "null", "null"), std::make_pair(D::kFp32, D::kFp32));
  TrainConfig absent;
  apply(R"({"train_batch_size": 8, "bf16": {"enabled": true}, "data_types": {}})", 1, absent);
  EXPECT_EQ(absent.grad_accum_dtype, GradientDtype::kModel);
  EXPECT_EQ(absent.comm_dtype, GradientDtype::kModel);

  // The bucket size counts elements of the dtype that the collectives move: fp32 here.
  TrainConfig buckets;
  apply(R"({"train_batch_size": 8, "bf16": {"enabled": true}, "communication_data_type": "fp32",
            "zero_optimization": {"reduce_bucket_size": 1048576}})",
        1, buckets);
  EXPECT_EQ(buckets.bucket_mb, 4.0);

  // Refused: a third dtype, a name DeepSpeed does not know, a wrong JSON type, unknown keys.
  std::string message =
      error(R"({"train_batch_size": 8, "bf16": {"enabled": true}, "communication_data_type": "fp16"})");
  EXPECT_TRUE(contains(message, "ds_config.json: 'communication_data_type' \"fp16\" is not "
                                "supported with bf16 (the model's dtype): hpc_train keeps "
                                "gradients in the model's dtype or in fp32; give \"bf16\" or "
                                "\"fp32\""))
      << message;
  message = error(R"({"train_batch_size": 8, "fp16": {"enabled": true},
                      "data_types": {"grad_accum_dtype": "bf16"}})");
  EXPECT_TRUE(contains(message, "'data_types.grad_accum_dtype' \"bf16\" is not supported with "
                                "fp16"))
      << message;
  message = error(R"({"train_batch_size": 8, "communication_data_type": "float32"})");
  EXPECT_TRUE(contains(message, "'communication_data_type' \"float32\": must be \"fp32\", "
                                "\"fp16\" or \"bf16\""))
      << message;
  message = error(R"({"train_batch_size": 8, "data_types": {"grad_accum_dtype": "int8"}})");
  EXPECT_TRUE(contains(message, "'data_types.grad_accum_dtype' \"int8\": must be \"fp32\", "
                                "\"fp16\" or \"bf16\" (or another of DeepSpeed's names, e.g. "
                                "\"float32\")"))
      << message;
  message = error(R"({"train_batch_size": 8, "data_types": {"grad_accum_dtype": 32}})");
  EXPECT_TRUE(contains(message, "'data_types.grad_accum_dtype' must be a string, not number 32"))
      << message;
  message = error(R"({"train_batch_size": 8, "data_types": "fp32"})");
  EXPECT_TRUE(contains(message, "'data_types' must be an object {...}")) << message;
  message = error(R"({"train_batch_size": 8, "data_types": {"grad_acum_dtype": "fp32"}})");
  EXPECT_TRUE(contains(message, "unknown key 'data_types.grad_acum_dtype'; known keys here: "
                                "grad_accum_dtype"))
      << message;

  // The command line wins; "auto" leaves the value to us; fp32 settings without effect warn.
  TrainConfig given;
  warnings = apply(R"({"train_batch_size": 8, "bf16": {"enabled": true},
                       "communication_data_type": "fp32",
                       "data_types": {"grad_accum_dtype": "auto"}})",
                   1, given, {"comm-dtype"});
  EXPECT_EQ(given.comm_dtype, GradientDtype::kModel);
  EXPECT_TRUE(any_contains(warnings, "'communication_data_type' fp32 is not used: --comm-dtype "
                                     "model on the command line wins"))
      << joined(warnings);
  EXPECT_TRUE(any_contains(warnings, "'data_types.grad_accum_dtype' is \"auto\": "
                                     "--grad-accum-dtype model (the INI file or default)"))
      << joined(warnings);
  TrainConfig no_effect;
  warnings = apply(R"({"train_batch_size": 8, "communication_data_type": "fp32",
                       "data_types": {"grad_accum_dtype": "fp32"}})",
                   1, no_effect);
  EXPECT_EQ(no_effect.grad_accum_dtype, GradientDtype::kFp32);
  EXPECT_TRUE(any_contains(warnings, "'data_types.grad_accum_dtype' fp32 has no effect: the "
                                     "model is fp32"))
      << joined(warnings);
  EXPECT_TRUE(any_contains(warnings, "'communication_data_type' fp32 has no effect: the model is "
                                     "fp32"))
      << joined(warnings);
  TrainConfig one_step;
  warnings = apply(R"({"train_batch_size": 8, "bf16": {"enabled": true},
                       "data_types": {"grad_accum_dtype": "fp32"}})",
                   1, one_step);
  EXPECT_TRUE(any_contains(warnings, "'data_types.grad_accum_dtype' fp32 has no effect: "
                                     "gradient_accumulation_steps is 1, nothing accumulates"))
      << joined(warnings);
}

TEST_F(DeepSpeedConfigTest, BatchDerivations) {
  const auto batch_of = [&](const std::string& keys, int world_size,
                            TrainConfig config = TrainConfig{}) {
    apply("{" + keys + "}", world_size, config);
    return std::make_pair(config.micro_batch, config.grad_accum);
  };
  using Pair = std::pair<int, int>;
  // train_batch_size and micro-batch: grad_accum = 256 / 32 / 2.
  EXPECT_EQ(batch_of(R"("train_batch_size": 256, "train_micro_batch_size_per_gpu": 32)", 2),
            Pair(32, 4));
  // train_batch_size and grad_accum: micro-batch = 256 / 4 / 2.
  EXPECT_EQ(batch_of(R"("train_batch_size": 256, "gradient_accumulation_steps": 2)", 4),
            Pair(32, 2));
  // micro-batch and grad_accum: train_batch_size = 16 x 3 x 3 is derived.
  EXPECT_EQ(batch_of(R"("train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 3)",
                     3),
            Pair(16, 3));
  // All three, consistent.
  EXPECT_EQ(batch_of(R"("train_batch_size": 96, "train_micro_batch_size_per_gpu": 16,
                        "gradient_accumulation_steps": 2)",
                     3),
            Pair(16, 2));
  // Only train_batch_size: grad_accum 1, micro-batch = 96 / 3.
  EXPECT_EQ(batch_of(R"("train_batch_size": 96)", 3), Pair(32, 1));
  // Only the micro-batch: grad_accum 1.
  TrainConfig accumulating;
  accumulating.grad_accum = 4;  // as if from the INI file: DeepSpeed's derivation replaces it
  EXPECT_EQ(batch_of(R"("train_micro_batch_size_per_gpu": 8)", 2, accumulating), Pair(8, 1));
  {
    TrainConfig config;
    config.grad_accum = 4;
    const std::vector<std::string> warnings =
        apply(R"({"train_micro_batch_size_per_gpu": 8})", 2, config);
    EXPECT_TRUE(any_contains(warnings, "gradient_accumulation_steps is 1, as DeepSpeed derives "
                                       "it from this file; the grad_accum 4"))
        << joined(warnings);
  }
  // "null" means not given, as in DeepSpeed.
  EXPECT_EQ(batch_of(R"("train_batch_size": 96, "train_micro_batch_size_per_gpu": null)", 3),
            Pair(32, 1));
  // 5e8-style floats without a fraction are whole numbers.
  EXPECT_EQ(batch_of(R"("train_batch_size": 64.0)", 2), Pair(32, 1));

  // Neither train_batch_size nor the micro-batch: the run's own values, and a warning.
  TrainConfig own;
  own.micro_batch = 24;
  own.grad_accum = 2;
  const std::vector<std::string> warnings = apply(R"({"gradient_clipping": 1.0})", 3, own);
  EXPECT_EQ(own.micro_batch, 24);
  EXPECT_EQ(own.grad_accum, 2);
  EXPECT_TRUE(any_contains(warnings, "gives neither train_batch_size nor "
                                     "train_micro_batch_size_per_gpu; using micro-batch 24 and "
                                     "grad_accum 2"))
      << joined(warnings);
}

TEST_F(DeepSpeedConfigTest, BatchIdentityMessages) {
  std::string message = error(R"({"train_batch_size": 100, "train_micro_batch_size_per_gpu": 32})",
                              2);
  EXPECT_TRUE(contains(message, "train_batch_size 100 must equal train_micro_batch_size_per_gpu "
                                "x gradient_accumulation_steps x world size (32 x 1 x 2 = 64 "
                                "with 2 ranks). With 2 ranks and micro-batch 32 use a "
                                "train_batch_size divisible by 2 x 32 = 64, e.g. 64 or 128; or "
                                "a micro-batch that divides 100"))
      << message;
  message = error(R"({"train_batch_size": 64, "gradient_accumulation_steps": 3})", 2);
  EXPECT_TRUE(contains(message, "(10 x 3 x 2 = 60 with 2 ranks). With 2 ranks use a "
                                "train_batch_size divisible by 2 x 3 = 6, e.g. 60 or 66 (or 384 "
                                "for micro-batch 64); or a gradient_accumulation_steps that "
                                "divides 64"))
      << message;
  message = error(R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 16,
                      "gradient_accumulation_steps": 2})",
                  3);
  EXPECT_TRUE(contains(message, "(16 x 2 x 3 = 96 with 3 ranks). With 3 ranks use "
                                "train_batch_size 96, or leave one of the three out so that it "
                                "is derived; or run it on 2 ranks"))
      << message;
  // Fewer samples than ranks: the derived micro-batch would be 0.
  message = error(R"({"train_batch_size": 2})", 3);
  EXPECT_TRUE(contains(message, "(0 x 1 x 3 = 0 with 3 ranks). With 3 ranks use a "
                                "train_batch_size divisible by 3, e.g. 3 (or 192 for "
                                "micro-batch 64); or run 2 on 1 or 2 ranks"))
      << message;
  message = error(R"({"train_batch_size": 0})");
  EXPECT_TRUE(contains(message, "'train_batch_size' 0 must be at least 1")) << message;
}

// Batch factors whose product with the world size overflows int64 are refused, naming the keys
// (a product that wrapped around could pass the identity); a train_batch_size near 2^63 gets
// its message at once (the search for rank counts that divide it used to run forever).
TEST_F(DeepSpeedConfigTest, BatchProductsBeyondInt64) {
  std::string message = error(R"({"train_micro_batch_size_per_gpu": 2147483647,
                                  "gradient_accumulation_steps": 2147483647})",
                              3);
  EXPECT_TRUE(contains(message, "train_micro_batch_size_per_gpu x gradient_accumulation_steps x "
                                "world size = 2147483647 x 2147483647 x 3 ranks overflows a "
                                "64-bit integer"))
      << message;
  // 2^62 x 2 x 2 = 2^64 would wrap around to 0.
  message = error(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4611686018427387904,
                      "gradient_accumulation_steps": 2})",
                  2);
  EXPECT_TRUE(contains(message, "= 4611686018427387904 x 2 x 2 ranks overflows a 64-bit integer"))
      << message;
  message = error(R"({"train_batch_size": 8, "gradient_accumulation_steps": 9223372036854775807})",
                  2);
  EXPECT_TRUE(contains(message, "gradient_accumulation_steps x world size = 9223372036854775807 x "
                                "2 ranks overflows a 64-bit integer"))
      << message;
  // The command line's micro-batch is named as such.
  TrainConfig config;
  config.micro_batch = 2147483647;
  message = error(R"({"gradient_accumulation_steps": 2147483647})", 3, {"micro-batch"}, config);
  EXPECT_TRUE(contains(message, "The train_micro_batch_size_per_gpu 2147483647 is --micro-batch "
                                "on the command line"))
      << message;

  const auto start = std::chrono::steady_clock::now();
  message = error(R"({"train_batch_size": 9223372036854775807})", 2);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  EXPECT_TRUE(contains(message, "With 2 ranks use a train_batch_size divisible by 2, e.g. "
                                "9223372036854775806 (or 128 for micro-batch 64); or run "
                                "9223372036854775807 on 1 or 7 ranks"))
      << message;
}

TEST_F(DeepSpeedConfigTest, CommandLineWins) {
  TrainConfig config;
  config.lr = 0.005;       // --lr 0.005
  config.micro_batch = 16;  // --micro-batch 16
  config.zero_stage = 0;   // --zero-stage 0
  const std::vector<std::string> warnings =
      apply(R"({"train_batch_size": 64,
                "optimizer": {"type": "Adam", "params": {"lr": 0.001, "weight_decay": 0.2}},
                "zero_optimization": {"stage": 2}})",
            2, config, {"lr", "micro-batch", "zero-stage"});
  EXPECT_EQ(config.lr, 0.005);
  EXPECT_EQ(config.micro_batch, 16);
  EXPECT_EQ(config.grad_accum, 2);  // 64 / 16 / 2: the command line's micro-batch counts as given
  EXPECT_EQ(config.zero_stage, 0);
  EXPECT_EQ(config.weight_decay, 0.2);  // not on the command line: the file's
  EXPECT_TRUE(any_contains(warnings, "'optimizer.params.lr' 0.001 is not used: --lr 0.005 on "
                                     "the command line wins"))
      << joined(warnings);
  EXPECT_TRUE(any_contains(warnings, "'zero_optimization.stage' 2 is not used: --zero-stage 0"))
      << joined(warnings);

  // The origin file at 3 ranks with --micro-batch 64: 64 / 64 / 3 accumulation steps is 0.
  TrainConfig origin;
  const std::string message =
      error(R"({"train_batch_size": 64})", 3, {"micro-batch"}, origin);
  EXPECT_TRUE(contains(message, "(64 x 0 x 3 = 0 with 3 ranks). The micro-batch 64 is "
                                "--micro-batch on the command line. With 3 ranks and "
                                "micro-batch 64 use a train_batch_size divisible by 3 x 64 = "
                                "192, e.g. 192; or run 64 on 1 rank (any divisor of 1)"))
      << message;

  // --grad-accum on the command line counts as given too.
  TrainConfig accum;
  accum.grad_accum = 2;
  apply(R"({"train_batch_size": 64, "gradient_accumulation_steps": 4})", 2, accum,
        {"grad-accum"});
  EXPECT_EQ(accum.grad_accum, 2);
  EXPECT_EQ(accum.micro_batch, 16);
}

TEST_F(DeepSpeedConfigTest, UnknownKeys) {
  std::string message = error(R"({"train_batch_sise": 64})");
  EXPECT_TRUE(contains(message, "ds_config.json: unknown key 'train_batch_sise'; known keys "
                                "here: train_batch_size, train_micro_batch_size_per_gpu, "
                                "gradient_accumulation_steps, optimizer, scheduler, fp16, bf16, "
                                "data_types, communication_data_type, zero_optimization, "
                                "gradient_clipping, steps_per_print, tensorboard, csv_monitor, "
                                "wall_clock_breakdown"))
      << message;
  EXPECT_TRUE(contains(message, "--deepspeed-allow-unknown")) << message;
  message = error(R"({"train_batch_size": 8,
                      "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "foo": 1}}})");
  EXPECT_TRUE(contains(message, "unknown key 'optimizer.params.foo'; known keys here: lr, betas, "
                                "eps, weight_decay, adam_w_mode, torch_adam"))
      << message;
  message = error(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
                      "params": {"warmup_num_steps": 10, "warmup_foo": 1}}})");
  EXPECT_TRUE(contains(message, "unknown key 'scheduler.params.warmup_foo'")) << message;

  TrainConfig config;
  const std::vector<std::string> warnings =
      apply(R"({"train_batch_size": 8, "activation_checkpointing": {"profile": false},
                "optimizer": {"type": "Adam", "params": {"lr": 0.002, "foo": 1}},
                "wall_clock_breakdown": false})",
            1, config, {}, /*allow_unknown=*/true);
  EXPECT_EQ(config.lr, 0.002);
  EXPECT_EQ(config.micro_batch, 8);
  EXPECT_TRUE(any_contains(warnings, "'activation_checkpointing' is not implemented by hpc_train "
                                     "and is ignored"))
      << joined(warnings);
  EXPECT_TRUE(any_contains(warnings, "ignoring unknown key 'optimizer.params.foo'"))
      << joined(warnings);
  EXPECT_TRUE(any_contains(warnings, "'wall_clock_breakdown' is ignored")) << joined(warnings);
}

// Note [Keys hpc_train does not implement]: keys that only watch the run, or move time and
// memory, warn and the run goes on; keys that would change the result stay errors.
TEST_F(DeepSpeedConfigTest, UnimplementedKeysWarnUnlessTheyChangeTheResult) {
  TrainConfig config;
  std::vector<std::string> warnings = apply(
      R"({"train_batch_size": 8, "flops_profiler": {"enabled": true},
          "wandb": {"enabled": true, "project": "p"}, "comet": {"enabled": true},
          "comms_logger": {"enabled": true}, "activation_checkpointing": {},
          "zero_optimization": {"stage": 2, "sub_group_size": 1e9, "round_robin_gradients": true},
          "prescale_gradients": false, "amp": {"enabled": false}})",
      1, config);
  for (const char* key : {"'flops_profiler'", "'wandb'", "'comet'", "'comms_logger'",
                          "'activation_checkpointing'", "'zero_optimization.sub_group_size'",
                          "'zero_optimization.round_robin_gradients'", "'prescale_gradients'",
                          "'amp'"}) {
    EXPECT_TRUE(any_contains(warnings, std::string(key) + " is not implemented by hpc_train and "
                                                          "is ignored"))
        << key << "\n" << joined(warnings);
  }
  EXPECT_TRUE(any_contains(warnings, "--tensorboard")) << joined(warnings);  // wandb's hint
  EXPECT_EQ(config.zero_stage, 2);
  EXPECT_EQ(config.micro_batch, 8);

  // What would change the result if ignored.
  std::string message = error(R"({"train_batch_size": 8, "amp": {"enabled": true}})");
  EXPECT_TRUE(contains(message, "'amp' is not supported and would change what the run computes"))
      << message;
  message = error(R"({"train_batch_size": 8, "gradient_predivide_factor": 8.0})");
  EXPECT_TRUE(contains(message, "'gradient_predivide_factor' is not supported")) << message;
  // A third dtype for the gradients (fp16 in an fp32 model) is refused (GradientDtypes below).
  message = error(R"({"train_batch_size": 8, "communication_data_type": "fp16"})");
  EXPECT_TRUE(contains(message, "'communication_data_type' \"fp16\" is not supported with fp32"))
      << message;
  message = error(R"({"train_batch_size": 8, "curriculum_learning": {"enabled": true}})");
  EXPECT_TRUE(contains(message, "'curriculum_learning' is not supported")) << message;
  message = error(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
                      "zero_quantized_gradients": true}})");
  EXPECT_TRUE(contains(message, "'zero_optimization.zero_quantized_gradients' true is not "
                                "supported"))
      << message;
  // A misspelt known key is not silently ignored.
  message = error(R"({"train_batch_size": 8, "gradient_cliping": 1.0})");
  EXPECT_TRUE(contains(message, "unknown key 'gradient_cliping'")) << message;
  // --deepspeed-allow-unknown ignores even those, with a warning.
  TrainConfig allowed;
  warnings = apply(R"({"train_batch_size": 8, "amp": {"enabled": true}})", 1, allowed, {},
                   /*allow_unknown=*/true);
  EXPECT_TRUE(any_contains(warnings, "ignoring 'amp' (--deepspeed-allow-unknown)"))
      << joined(warnings);
}

// DeepSpeed's monitor blocks map onto --tensorboard*/--csv-monitor*; keys left out keep ours.
TEST_F(DeepSpeedConfigTest, MonitorBlocks) {
  TrainConfig config;
  std::vector<std::string> warnings = apply(
      R"({"train_batch_size": 8,
          "tensorboard": {"enabled": false, "output_path": "/tmp/tb", "job_name": "job1"},
          "csv_monitor": {"enabled": true, "output_path": "logs/", "extra": 1}})",
      1, config);
  EXPECT_FALSE(config.tensorboard);
  EXPECT_EQ(config.tensorboard_output_path, "/tmp/tb");
  EXPECT_EQ(config.tensorboard_job_name, "job1");
  EXPECT_TRUE(config.csv_monitor);
  EXPECT_EQ(config.csv_monitor_output_path, "logs/");
  EXPECT_EQ(config.csv_monitor_job_name, "csv_monitor");  // left out: hpc_train's
  EXPECT_TRUE(any_contains(warnings, "'csv_monitor.extra' is not implemented")) << joined(warnings);
  EXPECT_EQ(monitor_directory(config.tensorboard_output_path, config.tensorboard_job_name, "run"),
            "/tmp/tb/job1");
  EXPECT_EQ(monitor_directory("", "tensorboard", "runs/x"), "runs/x/tensorboard");

  // The command line wins, as for every key.
  TrainConfig given;
  given.tensorboard = true;
  warnings = apply(R"({"train_batch_size": 8, "tensorboard": {"enabled": false}})", 1, given,
                   {"tensorboard"});
  EXPECT_TRUE(given.tensorboard);
  EXPECT_TRUE(any_contains(warnings, "--tensorboard true on the command line wins"))
      << joined(warnings);
  std::string message = error(R"({"train_batch_size": 8, "tensorboard": {"enabled": "on"}})");
  EXPECT_TRUE(contains(message, "'tensorboard.enabled' must be true or false")) << message;
}

// Note ["auto" values]: Hugging Face's template style. "auto" leaves the value to the command
// line, INI file or default (not DeepSpeed's default for a key left out), and says what it is.
TEST_F(DeepSpeedConfigTest, AutoValuesLeaveTheValueToUs) {
  TrainConfig config;
  config.lr = 0.005;
  config.micro_batch = 16;
  config.grad_accum = 2;
  config.weight_decay = 0.05;
  config.precision = Precision::kBf16;
  config.warmup_steps = 7;
  config.bucket_mb = 12.5;
  const std::vector<std::string> warnings = apply(
      R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
          "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
          "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 12},
          "bf16": {"enabled": "auto"},
          "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto",
                                                    "eps": "auto", "weight_decay": "auto"}},
          "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto",
                        "warmup_max_lr": "auto", "warmup_num_steps": "auto"}},
          "zero_optimization": {"stage": 1, "reduce_bucket_size": "auto", "overlap_comm": "auto",
                                "contiguous_gradients": true},
          "tensorboard": {"enabled": "auto"}})",
      2, config, {"micro-batch"});
  EXPECT_EQ(config.lr, 0.005);
  EXPECT_EQ(config.micro_batch, 16);
  EXPECT_EQ(config.grad_accum, 2);
  EXPECT_EQ(config.weight_decay, 0.05);  // not FusedAdam's 0
  EXPECT_EQ(config.beta1, 0.9);
  EXPECT_EQ(config.precision, Precision::kBf16);
  EXPECT_EQ(config.initial_scale_power, 12);  // given in the file
  EXPECT_EQ(config.warmup_steps, 7);
  EXPECT_EQ(config.lr_schedule, LrScheduleKind::kWarmup);
  EXPECT_EQ(config.bucket_mb, 12.5);
  EXPECT_EQ(config.zero_stage, 1);
  EXPECT_TRUE(config.tensorboard);
  EXPECT_TRUE(any_contains(warnings, "'optimizer.params.lr' is \"auto\": --lr 0.005 (the INI file "
                                     "or default)"))
      << joined(warnings);
  EXPECT_TRUE(any_contains(warnings, "'train_micro_batch_size_per_gpu' is \"auto\": "
                                     "--micro-batch 16 (the command line)"))
      << joined(warnings);
  EXPECT_TRUE(any_contains(warnings, "'train_batch_size' is \"auto\": 64 (micro-batch 16 x "
                                     "grad-accum 2 x 2 ranks)"))
      << joined(warnings);
  EXPECT_TRUE(any_contains(warnings, "'fp16.enabled' is \"auto\": --precision bf16"))
      << joined(warnings);
  EXPECT_TRUE(any_contains(warnings, "'scheduler.params.warmup_num_steps' is \"auto\": "
                                     "--warmup-steps 7"))
      << joined(warnings);
}

TEST_F(DeepSpeedConfigTest, WrongJsonTypes) {
  std::string message = error(R"({"train_batch_size": "64"})");
  EXPECT_TRUE(contains(message, "ds_config.json: 'train_batch_size' must be a whole number, not "
                                "string \"64\""))
      << message;
  message = error(R"({"train_batch_size": 64.5})");
  EXPECT_TRUE(contains(message, "'train_batch_size' must be a whole number, not number 64.5"))
      << message;
  message = error(R"({"train_batch_size": 8, "fp16": {"enabled": "yes"}})");
  EXPECT_TRUE(contains(message, "'fp16.enabled' must be true or false, not string \"yes\""))
      << message;
  // "auto" where hpc_train has no option to leave the value to.
  message = error(R"({"train_batch_size": 8, "scheduler": {"type": "auto"}})");
  EXPECT_TRUE(contains(message, "'scheduler.type' \"auto\" is not supported")) << message;
  message = error(R"({"train_batch_size": 8, "optimizer": "Adam"})");
  EXPECT_TRUE(contains(message, "'optimizer' must be an object {...}, not string")) << message;
  message = error(R"({"train_batch_size": 8, "gradient_clipping": true})");
  EXPECT_TRUE(contains(message, "'gradient_clipping' must be a number, not boolean true"))
      << message;
}

TEST_F(DeepSpeedConfigTest, FileErrors) {
  std::string message = error("{\n  \"train_batch_size\": 64,\n}\n");
  EXPECT_TRUE(contains(message, "ds_config.json: not valid JSON (byte ")) << message;
  EXPECT_TRUE(contains(message, "parse error")) << message;
  message = error(R"({"fp16": {"enabled": true, "enabled": false}, "train_batch_size": 8})");
  EXPECT_TRUE(contains(message, "key 'fp16.enabled' appears twice")) << message;
  message = error("[1, 2]");
  EXPECT_TRUE(contains(message, "the top level must be a JSON object")) << message;

  // A number beyond a double's range: nlohmann throws out_of_range, not parse_error.
  message = error(R"({"train_batch_size": 1e400})");
  EXPECT_TRUE(contains(message, "ds_config.json: not valid JSON")) << message;
  EXPECT_TRUE(contains(message, "number overflow parsing '1e400'")) << message;
  // 100,000 nested arrays (a 200 kB file) overflowed the stack while the message quoted them.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  message = error(R"({"train_batch_size": 8, "optimizer": )" + deep + "}");
  EXPECT_TRUE(contains(message, "ds_config.json: arrays and objects nested more than 128 levels"))
      << message.substr(0, 200);
  const std::string nested_127 = std::string(126, '[') + std::string(126, ']');
  message = error(R"({"train_batch_size": 8, "optimizer": )" + nested_127 + "}");
  EXPECT_TRUE(contains(message, "'optimizer' must be an object {...}, not array")) << message;

  TrainConfig config;
  DeepSpeedImport missing;
  missing.path = (dir_ / "missing.json").string();
  try {
    apply_deepspeed_config(missing, 1, {}, config);
    ADD_FAILURE() << "no ConfigError for a missing file";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "missing.json: cannot open it")) << e.what();
  }
  DeepSpeedImport none;  // no --deepspeed-config: nothing happens
  EXPECT_TRUE(apply_deepspeed_config(none, 3, {}, config).empty());
}

}  // namespace
}  // namespace hpc_train

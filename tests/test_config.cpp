// Config: defaults, command line, INI file, precedence, round trip, --help/--version, and the
// messages of every rejected input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "hpc_train/config/config.h"
#include "hpc_train/data/dataset_file.h"
#include "hpc_train/error.h"
#include "hpc_train/io/reader_threads.h"
#include "hpc_train/model/model_names.h"

namespace hpc_train {
namespace {

namespace fs = std::filesystem;

CommandLine parse(std::vector<std::string> args) {
  args.insert(args.begin(), "hpc_train");
  std::vector<const char*> argv;
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data());
}

// The ConfigError message of `action`, or a failure when it does not throw one.
std::string config_error(const std::function<void()>& action) {
  try {
    action();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.exit_code(), kExitUsageError);
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError";
  return "";
}

std::string parse_error(const std::vector<std::string>& args) {
  return config_error([&] { parse(args); });
}

void expect_same(const TrainConfig& a, const TrainConfig& b) {
  EXPECT_EQ(a.dataset_path, b.dataset_path);
  EXPECT_EQ(a.drop_last, b.drop_last);
  EXPECT_EQ(a.prefetch_batches, b.prefetch_batches);
  EXPECT_EQ(a.reader_threads, b.reader_threads);
  EXPECT_EQ(a.model, b.model);
  EXPECT_EQ(a.epochs, b.epochs);
  EXPECT_EQ(a.max_steps, b.max_steps);
  EXPECT_EQ(a.micro_batch, b.micro_batch);
  EXPECT_EQ(a.eval_batch, b.eval_batch);
  EXPECT_EQ(a.optimizer, b.optimizer);
  EXPECT_EQ(a.lr, b.lr);  // exact: the INI text must read back bit for bit
  EXPECT_EQ(a.beta1, b.beta1);
  EXPECT_EQ(a.beta2, b.beta2);
  EXPECT_EQ(a.eps, b.eps);
  EXPECT_EQ(a.weight_decay, b.weight_decay);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.grad_accum, b.grad_accum);
  EXPECT_EQ(a.clip_grad, b.clip_grad);
  EXPECT_EQ(a.lr_schedule, b.lr_schedule);
  EXPECT_EQ(a.warmup_steps, b.warmup_steps);
  EXPECT_EQ(a.warmup_type, b.warmup_type);
  EXPECT_EQ(a.warmup_start_ratio, b.warmup_start_ratio);
  EXPECT_EQ(a.cosine_final_ratio, b.cosine_final_ratio);
  EXPECT_EQ(a.schedule_steps, b.schedule_steps);
  EXPECT_EQ(a.zero_stage, b.zero_stage);
  EXPECT_EQ(a.precision, b.precision);
  EXPECT_EQ(a.loss_scale, b.loss_scale);
  EXPECT_EQ(a.initial_scale_power, b.initial_scale_power);
  EXPECT_EQ(a.loss_scale_window, b.loss_scale_window);
  EXPECT_EQ(a.hysteresis, b.hysteresis);
  EXPECT_EQ(a.min_loss_scale, b.min_loss_scale);
  EXPECT_EQ(a.bucket_mb, b.bucket_mb);
  EXPECT_EQ(a.first_bucket_mb, b.first_bucket_mb);
  EXPECT_EQ(a.overlap_comm, b.overlap_comm);
  EXPECT_EQ(a.threads_per_rank, b.threads_per_rank);
  EXPECT_EQ(a.run_dir, b.run_dir);
  EXPECT_EQ(a.log_every, b.log_every);
  EXPECT_EQ(a.progress, b.progress);
  // Covers options added later too: to_ini prints every option, each value unambiguously.
  EXPECT_EQ(to_ini(a), to_ini(b));
}

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "hpc_train_test_config_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  fs::path dir_;
};

TEST(Config, DefaultsAreTheOriginRecipe) {
  const TrainConfig config;
  EXPECT_EQ(config.model, "simple_cnn");
  EXPECT_EQ(config.micro_batch, 64);
  EXPECT_EQ(config.epochs, 10);
  EXPECT_EQ(config.optimizer, OptimizerKind::kAdamW);
  EXPECT_EQ(config.lr, 1e-3);
  EXPECT_EQ(config.beta1, 0.9);
  EXPECT_EQ(config.beta2, 0.999);
  EXPECT_EQ(config.eps, 1e-8);
  EXPECT_EQ(config.weight_decay, 0.01);
  EXPECT_EQ(config.seed, 42u);
  // The trust ratios' options as the papers have them (Note [Trust ratios] in optimizer.h):
  // LARS's eta 0.001, LAMB's ratio unbounded and its moments bias-corrected.
  EXPECT_EQ(config.trust_coefficient, 1e-3);
  EXPECT_EQ(config.min_trust_ratio, 0.0);
  EXPECT_EQ(config.max_trust_ratio, 0.0);
  EXPECT_EQ(config.lamb_bias_correction, LambBiasCorrection::kMoments);
  // No accumulation, clipping or schedule; fp32 without ZeRO; DDP-like buckets with overlap.
  EXPECT_EQ(config.grad_accum, 1);
  EXPECT_EQ(config.clip_grad, 0.0);
  EXPECT_EQ(config.lr_schedule, LrScheduleKind::kConstant);
  EXPECT_EQ(config.warmup_steps, 0);
  EXPECT_EQ(config.warmup_type, WarmupType::kLinear);
  EXPECT_EQ(config.warmup_start_ratio, 0.0);
  EXPECT_EQ(config.cosine_final_ratio, 0.0);
  EXPECT_EQ(config.schedule_steps, 0);
  EXPECT_EQ(config.zero_stage, 0);
  EXPECT_EQ(config.precision, Precision::kFp32);
  // The fp16 loss scaler's defaults are DeepSpeed's.
  EXPECT_EQ(config.loss_scale, 0.0);
  EXPECT_EQ(config.initial_scale_power, 16);
  EXPECT_EQ(config.loss_scale_window, 1000);
  EXPECT_EQ(config.hysteresis, 2);
  EXPECT_EQ(config.min_loss_scale, 1.0);
  EXPECT_EQ(config.bucket_mb, 0.0);  // chosen by the ZeRO stage (test_run_options.cpp)
  EXPECT_EQ(config.first_bucket_mb, 1.0);
  EXPECT_TRUE(config.overlap_comm);
  // Checkpoints at epoch ends only, neither by steps nor by time.
  EXPECT_EQ(config.checkpoint_every, 0);
  EXPECT_EQ(config.checkpoint_every_minutes, 0.0);
  EXPECT_NO_THROW(validate(config));

  const CommandLine command_line = parse({});
  EXPECT_EQ(command_line.action, CommandLine::Action::kTrain);
  EXPECT_TRUE(command_line.config_file.empty());
  EXPECT_TRUE(command_line.deepspeed.path.empty());
  EXPECT_FALSE(command_line.deepspeed.allow_unknown_keys);
  EXPECT_TRUE(command_line.given_on_command_line.empty());
  expect_same(command_line.config, config);
}

TEST(Config, CommandLineSetsTrainingZeroAndCommOptions) {
  const TrainConfig c =
      parse({"--grad-accum", "4", "--clip-grad", "1.5", "--lr-schedule", "warmup-cosine",
             "--warmup-steps", "300", "--warmup-type", "log", "--warmup-start-ratio", "0.1",
             "--cosine-final-ratio", "0.01", "--schedule-steps", "9000", "--zero-stage", "2",
             "--precision", "bf16", "--loss-scale", "1024", "--initial-scale-power", "12",
             "--loss-scale-window", "200", "--hysteresis", "3", "--min-loss-scale", "0.5",
             "--bucket-mb", "50", "--first-bucket-mb=2.5", "--overlap-comm=false"})
          .config;
  EXPECT_EQ(c.grad_accum, 4);
  EXPECT_EQ(c.clip_grad, 1.5);
  EXPECT_EQ(c.lr_schedule, LrScheduleKind::kWarmupCosine);
  EXPECT_EQ(c.warmup_steps, 300);
  EXPECT_EQ(c.warmup_type, WarmupType::kLog);
  EXPECT_EQ(c.warmup_start_ratio, 0.1);
  EXPECT_EQ(c.cosine_final_ratio, 0.01);
  EXPECT_EQ(c.schedule_steps, 9000);
  EXPECT_EQ(c.zero_stage, 2);
  EXPECT_EQ(c.precision, Precision::kBf16);
  EXPECT_EQ(c.loss_scale, 1024.0);
  EXPECT_EQ(c.initial_scale_power, 12);
  EXPECT_EQ(c.loss_scale_window, 200);
  EXPECT_EQ(c.hysteresis, 3);
  EXPECT_EQ(c.min_loss_scale, 0.5);
  EXPECT_EQ(c.bucket_mb, 50.0);
  EXPECT_EQ(c.first_bucket_mb, 2.5);
  EXPECT_FALSE(c.overlap_comm);
  EXPECT_NO_THROW(validate(c));
}

TEST(Config, DeepSpeedOptions) {
  CommandLine command_line = parse({"--deepspeed-config", "configs/ds_origin.json"});
  EXPECT_EQ(command_line.deepspeed.path, "configs/ds_origin.json");
  EXPECT_FALSE(command_line.deepspeed.allow_unknown_keys);
  command_line = parse({"--deepspeed-config=ds.json", "--deepspeed-allow-unknown"});
  EXPECT_EQ(command_line.deepspeed.path, "ds.json");
  EXPECT_TRUE(command_line.deepspeed.allow_unknown_keys);
  EXPECT_FALSE(parse({"--deepspeed-allow-unknown=false"}).deepspeed.allow_unknown_keys);
  // Not TrainConfig fields: to_ini does not carry them (the imported values land in the fields).
  EXPECT_EQ(to_ini(command_line.config), to_ini(TrainConfig{}));
  EXPECT_EQ(to_ini(command_line.config).find("deepspeed"), std::string::npos);

  std::string message = parse_error({"--deepspeed-allow-unknown=maybe"});
  EXPECT_NE(message.find("--deepspeed-allow-unknown=maybe: expected true or false"),
            std::string::npos) << message;
  message = parse_error({"--deepspeed-config", ""});
  EXPECT_NE(message.find("--deepspeed-config '':"), std::string::npos) << message;
  message = parse_error({"--deepspeed-confg", "x.json"});
  EXPECT_NE(message.find("did you mean --deepspeed-config?"), std::string::npos) << message;
}

TEST_F(ConfigTest, GivenOnCommandLineNamesOnlyTheCommandLinesOptions) {
  const std::string path = write("run.ini",
                                 "[training]\nmicro_batch = 16\nlr = 0.1\n"
                                 "[zero]\nzero_stage = 1\n[comm]\noverlap_comm = false\n");
  const CommandLine command_line =
      parse({"--config", path, "--lr", "0.2", "--precision", "fp16", "--drop-last",
             "--overlap-comm=true", "--deepspeed-config", "ds.json"});
  const std::set<std::string> expected = {"config", "lr", "precision", "drop-last",
                                          "overlap-comm", "deepspeed-config"};
  EXPECT_EQ(command_line.given_on_command_line, expected);
  EXPECT_EQ(command_line.config.lr, 0.2);
  EXPECT_EQ(command_line.config.micro_batch, 16);  // from the file, so not "given"
  EXPECT_EQ(command_line.config.zero_stage, 1);
  EXPECT_TRUE(command_line.config.overlap_comm);  // the command line wins
  // A value equal to the default still counts: it was asked for.
  EXPECT_EQ(parse({"--epochs", "10"}).given_on_command_line, std::set<std::string>{"epochs"});
}

TEST(Config, CommandLineSetsEveryOption) {
  const TrainConfig c =
      parse({"--dataset", "d.h5", "--drop-last", "--prefetch", "7", "--model", "resnet18",
             "--epochs", "3", "--max-steps", "20000000000", "--micro-batch", "32",
             "--eval-batch", "1000", "--optimizer", "adam", "--lr", "3e-4", "--beta1", "0.8", "--beta2", "0.99",
             "--eps=1e-6", "--weight-decay", "0", "--seed", "18446744073709551615",
             "--threads-per-rank", "2", "--run-dir", "runs/my run", "--log-every", "5",
             "--progress", "lines"})
          .config;
  EXPECT_EQ(c.dataset_path, "d.h5");
  EXPECT_TRUE(c.drop_last);
  EXPECT_EQ(c.prefetch_batches, 7);
  EXPECT_EQ(c.model, "resnet18");
  EXPECT_EQ(c.epochs, 3);
  EXPECT_EQ(c.max_steps, 20000000000);
  EXPECT_EQ(c.micro_batch, 32);
  EXPECT_EQ(c.eval_batch, 1000);
  EXPECT_EQ(c.optimizer, OptimizerKind::kAdam);
  EXPECT_EQ(c.lr, 3e-4);
  EXPECT_EQ(c.beta1, 0.8);
  EXPECT_EQ(c.beta2, 0.99);
  EXPECT_EQ(c.eps, 1e-6);
  EXPECT_EQ(c.weight_decay, 0.0);
  EXPECT_EQ(c.seed, 18446744073709551615u);
  EXPECT_EQ(c.threads_per_rank, 2);
  EXPECT_EQ(c.run_dir, "runs/my run");
  EXPECT_EQ(c.log_every, 5);
  EXPECT_EQ(c.progress, ProgressStyle::kLines);
}

// LAMB's and LARS's options, on the command line and in the INI file; each validates with its
// own optimizer.
TEST_F(ConfigTest, LayerAdaptiveOptimizerOptions) {
  const CommandLine lamb =
      parse({"--optimizer", "lamb", "--min-trust-ratio", "0.01", "--max-trust-ratio", "10",
             "--lamb-bias-correction", "step", "--beta2", "0.99"});
  EXPECT_EQ(lamb.config.optimizer, OptimizerKind::kLamb);
  EXPECT_EQ(lamb.config.min_trust_ratio, 0.01);
  EXPECT_EQ(lamb.config.max_trust_ratio, 10.0);
  EXPECT_EQ(lamb.config.lamb_bias_correction, LambBiasCorrection::kStepSize);
  EXPECT_EQ(lamb.config.beta2, 0.99);
  EXPECT_NO_THROW(validate(lamb.config));
  EXPECT_EQ(parse({"--lamb-bias-correction", "none"}).config.lamb_bias_correction,
            LambBiasCorrection::kNone);

  const std::string path = write("lars.ini",
                                 "[training]\noptimizer = lars\ntrust_coefficient = 0.02\n"
                                 "momentum = 0.9\nnesterov = true\n");
  const TrainConfig lars = parse({"--config", path}).config;
  EXPECT_EQ(lars.optimizer, OptimizerKind::kLars);
  EXPECT_EQ(lars.trust_coefficient, 0.02);
  EXPECT_EQ(lars.momentum, 0.9);
  EXPECT_TRUE(lars.nesterov);
  EXPECT_NO_THROW(validate(lars));
}

// Which optimizers keep Adam's moments, and whose checkpointed state resumes under which.
TEST(Config, OptimizerStateFamilies) {
  EXPECT_TRUE(keeps_adam_moments(OptimizerKind::kAdamW));
  EXPECT_TRUE(keeps_adam_moments(OptimizerKind::kAdam));
  EXPECT_TRUE(keeps_adam_moments(OptimizerKind::kLamb));
  EXPECT_FALSE(keeps_adam_moments(OptimizerKind::kSgd));
  EXPECT_FALSE(keeps_adam_moments(OptimizerKind::kLars));
  EXPECT_TRUE(shares_optimizer_state(OptimizerKind::kAdamW, OptimizerKind::kLamb));
  EXPECT_TRUE(shares_optimizer_state(OptimizerKind::kLamb, OptimizerKind::kAdam));
  EXPECT_TRUE(shares_optimizer_state(OptimizerKind::kSgd, OptimizerKind::kSgd));
  EXPECT_TRUE(shares_optimizer_state(OptimizerKind::kLars, OptimizerKind::kLars));
  // LARS's buffer sums trust-scaled gradients: SGD's is not one.
  EXPECT_FALSE(shares_optimizer_state(OptimizerKind::kSgd, OptimizerKind::kLars));
  EXPECT_FALSE(shares_optimizer_state(OptimizerKind::kLars, OptimizerKind::kSgd));
  EXPECT_FALSE(shares_optimizer_state(OptimizerKind::kSgd, OptimizerKind::kAdamW));
}

// Both checkpoint rules may be given; minutes are a number, fractions included.
TEST(Config, CheckpointEveryStepsAndMinutes) {
  const TrainConfig c =
      parse({"--checkpoint-every", "500", "--checkpoint-every-minutes", "7.5"}).config;
  EXPECT_EQ(c.checkpoint_every, 500);
  EXPECT_EQ(c.checkpoint_every_minutes, 7.5);
  EXPECT_NO_THROW(validate(c));
  const std::string message = parse_error({"--checkpoint-every-minutes", "half"});
  EXPECT_NE(message.find("--checkpoint-every-minutes half: expected a number like 0.001"),
            std::string::npos)
      << message;
}

// --resume is a file, or auto: the run directory's newest checkpoint; empty starts afresh.
TEST(Config, ResumeAutoMeansTheNewestCheckpoint) {
  EXPECT_FALSE(resumes_newest_checkpoint(TrainConfig{}));
  EXPECT_TRUE(resumes_newest_checkpoint(parse({"--resume", "auto"}).config));
  const TrainConfig file = parse({"--resume", "runs/a/checkpoints/step-00000004.h5"}).config;
  EXPECT_FALSE(resumes_newest_checkpoint(file));
  EXPECT_EQ(file.resume, "runs/a/checkpoints/step-00000004.h5");
  EXPECT_FALSE(resumes_newest_checkpoint(parse({"--resume", "auto.h5"}).config));
}

TEST(Config, FlagTakesAnExplicitValue) {
  EXPECT_FALSE(parse({"--drop-last=false"}).config.drop_last);
  EXPECT_TRUE(parse({"--drop-last=true"}).config.drop_last);
  EXPECT_FALSE(parse({"--drop-last", "false"}).config.drop_last);
  EXPECT_TRUE(parse({"--drop-last", "--epochs", "3"}).config.drop_last);
  EXPECT_FALSE(parse({"--overlap-comm=false"}).config.overlap_comm);
  EXPECT_FALSE(parse({"--overlap-comm", "off"}).config.overlap_comm);
  EXPECT_TRUE(parse({"--overlap-comm"}).config.overlap_comm);
  // A negative number is a value, not an option (validate() rejects it later).
  EXPECT_EQ(parse({"--max-steps", "-1"}).config.max_steps, -1);
}

TEST_F(ConfigTest, IniFileWithSections) {
  const std::string path = write("run.ini",
                                 "# a comment\n"
                                 "[data]\n"
                                 "dataset = data/cifar10.h5   # trailing comment\n"
                                 "drop_last = true\n"
                                 "[training]\n"
                                 "micro_batch = 128\n"
                                 "lr = 0.0005\n"
                                 "[output]\n"
                                 "progress = bar\n");
  const CommandLine command_line = parse({"--config", path});
  EXPECT_EQ(command_line.config_file, path);
  EXPECT_EQ(command_line.config.dataset_path, "data/cifar10.h5");
  EXPECT_TRUE(command_line.config.drop_last);
  EXPECT_EQ(command_line.config.micro_batch, 128);
  EXPECT_EQ(command_line.config.lr, 0.0005);
  EXPECT_EQ(command_line.config.progress, ProgressStyle::kBar);
  EXPECT_EQ(command_line.config.epochs, 10);  // not in the file: the default
}

// --reader-threads (Note [Reads in flight]): from the command line and the INI file, validated
// to [kMinReaderThreads, kMaxReaderThreads] with a message naming the option and the range.
TEST_F(ConfigTest, ReaderThreadsBounds) {
  EXPECT_EQ(TrainConfig{}.reader_threads, 8);
  EXPECT_EQ(parse({"--reader-threads", "3"}).config.reader_threads, 3);
  const std::string path = write("readers.ini", "[data]\nreader_threads = 65\n");
  const TrainConfig from_file = parse({"--config", path}).config;
  EXPECT_EQ(from_file.reader_threads, 65);
  EXPECT_EQ(config_error([&] { validate(from_file); }),
            "--reader-threads 65: must be in [1, 64] (reads in flight a rank; 1 = one at a time)");
  for (int threads : {kMinReaderThreads - 1, -3, kMaxReaderThreads + 1}) {
    TrainConfig config;
    config.reader_threads = threads;
    EXPECT_EQ(config_error([&] { validate(config); }).rfind(
                  "--reader-threads " + std::to_string(threads) + ": must be in [1, 64]", 0),
              0u);
  }
  for (int threads : {kMinReaderThreads, kMaxReaderThreads}) {
    TrainConfig config;
    config.reader_threads = threads;
    EXPECT_NO_THROW(validate(config));
  }
}

// --fused-batch-norm (Note [Fused batch norm]) and --fused-pooling (Note [Fused pooling]): on by
// default, off from the command line or the INI file's [runtime], anything but a boolean refused
// naming the option (or the file and line).
TEST_F(ConfigTest, FusedKernelSwitches) {
  EXPECT_TRUE(TrainConfig{}.fused_pooling);
  EXPECT_FALSE(parse({"--fused-pooling=false"}).config.fused_pooling);
  EXPECT_TRUE(parse({"--fused-pooling=false"}).config.fused_batch_norm);
  EXPECT_FALSE(parse({"--config", write("pooling.ini", "[runtime]\nfused_pooling = off\n")})
                   .config.fused_pooling);
  EXPECT_TRUE(TrainConfig{}.fused_batch_norm);
  EXPECT_FALSE(parse({"--fused-batch-norm=false"}).config.fused_batch_norm);
  const std::string off = write("fused.ini", "[runtime]\nfused_batch_norm = false\n");
  EXPECT_FALSE(parse({"--config", off}).config.fused_batch_norm);
  std::string message = parse_error({"--fused-batch-norm=maybe"});
  EXPECT_NE(message.find("--fused-batch-norm=maybe: expected true or false"), std::string::npos)
      << message;
  const std::string bad = write("fused-bad.ini", "[runtime]\n\nfused_batch_norm = maybe\n");
  message = parse_error({"--config", bad});
  EXPECT_NE(message.find(bad + ":3: fused_batch_norm = maybe in [runtime]"), std::string::npos)
      << message;
  message = parse_error({"--fused-pooling=2"});
  EXPECT_NE(message.find("--fused-pooling=2: expected true or false"), std::string::npos)
      << message;
}

// Note [Gradient precision]: --grad-accum-dtype [zero] and --comm-dtype [comm], model (the
// default: runs as before) or fp32, from the command line and the INI file, in --help and
// to_ini; any other name is refused (UnknownChoiceNamesTheOptionValueAndNames).
TEST_F(ConfigTest, GradientDtypeOptions) {
  EXPECT_EQ(TrainConfig{}.grad_accum_dtype, GradientDtype::kModel);
  EXPECT_EQ(TrainConfig{}.comm_dtype, GradientDtype::kModel);
  TrainConfig c = parse({"--precision", "bf16", "--grad-accum", "8", "--grad-accum-dtype", "fp32",
                         "--comm-dtype", "fp32"})
                      .config;
  EXPECT_EQ(c.grad_accum_dtype, GradientDtype::kFp32);
  EXPECT_EQ(c.comm_dtype, GradientDtype::kFp32);
  EXPECT_NO_THROW(validate(c));
  // With fp32 or one micro-step they change nothing, and are accepted.
  c = parse({"--grad-accum-dtype", "fp32", "--comm-dtype", "fp32"}).config;
  EXPECT_NO_THROW(validate(c));
  c = parse({"--grad-accum-dtype=model", "--comm-dtype=model"}).config;
  EXPECT_EQ(c.grad_accum_dtype, GradientDtype::kModel);
  EXPECT_EQ(c.comm_dtype, GradientDtype::kModel);

  const std::string path =
      write("dtypes.ini", "[zero]\ngrad_accum_dtype = fp32\n[comm]\ncomm_dtype = fp32\n");
  c = parse({"--config", path}).config;
  EXPECT_EQ(c.grad_accum_dtype, GradientDtype::kFp32);
  EXPECT_EQ(c.comm_dtype, GradientDtype::kFp32);
  EXPECT_EQ(parse({"--config", path, "--comm-dtype", "model"}).config.comm_dtype,
            GradientDtype::kModel);
  const std::string text = to_ini(c);
  EXPECT_NE(text.find("precision = fp32\ngrad_accum_dtype = fp32\n"), std::string::npos) << text;
  EXPECT_NE(text.find("overlap_comm = true\ncomm_dtype = fp32\n"), std::string::npos) << text;
  EXPECT_EQ(to_ini(TrainConfig{}).find("grad_accum_dtype = model\n") != std::string::npos, true);
  const std::string misplaced = write("misplaced.ini", "[comm]\ngrad_accum_dtype = fp32\n");
  EXPECT_NE(parse_error({"--config", misplaced}).find("grad_accum_dtype belongs under [zero]"),
            std::string::npos);

  const std::string help = parse({"--help"}).text;
  for (const char* expected : {"--grad-accum-dtype TEXT (=model)", "--comm-dtype TEXT (=model)"})
    EXPECT_NE(help.find(expected), std::string::npos) << expected << "\n" << help;
}

TEST_F(ConfigTest, CommandLineBeatsIniFile) {
  const std::string path = write("run.ini", "[training]\nepochs = 5\nlr = 0.1\n");
  const TrainConfig config = parse({"--epochs", "7", "--config", path}).config;
  EXPECT_EQ(config.epochs, 7);
  EXPECT_EQ(config.lr, 0.1);
}

TEST_F(ConfigTest, ToIniReadsBackIdentically) {
  TrainConfig config;
  EXPECT_NE(to_ini(config).find("lr = 0.001\n"), std::string::npos) << to_ini(config);
  EXPECT_NE(to_ini(config).find("run_dir = \n"), std::string::npos) << to_ini(config);
  expect_same(parse({"--config", write("defaults.ini", to_ini(config))}).config, config);

  config.dataset_path = "/scratch/some dir/set.h5";
  config.drop_last = true;
  config.reader_threads = 5;
  config.model = "resnet18";
  config.max_steps = 123456789012;
  config.lr = 0.1 + 0.2;  // 0.30000000000000004: needs 17 digits
  config.beta1 = 1.0 / 3.0;
  config.eps = 5e-324;  // smallest subnormal
  config.weight_decay = 0.0;
  config.seed = 18446744073709551615u;
  config.run_dir = "runs/a";
  config.progress = ProgressStyle::kLines;
  config.augment = Switch::kOff;
  config.resident_data = Switch::kOn;
  config.device = DeviceChoice::kCpu;
  config.backend = BackendChoice::kNone;
  config.cuda_graph = Switch::kOff;
  config.grad_accum = 8;
  config.clip_grad = 0.7;
  config.lr_schedule = LrScheduleKind::kWarmup;
  config.warmup_steps = 1000;
  config.warmup_type = WarmupType::kLog;
  config.warmup_start_ratio = 0.1;
  config.cosine_final_ratio = 1e-4;
  config.schedule_steps = 123456;
  config.zero_stage = 2;
  config.precision = Precision::kFp16;
  config.loss_scale = 0.5;
  config.initial_scale_power = 20;
  config.loss_scale_window = 77;
  config.hysteresis = 5;
  config.min_loss_scale = 1.0 / 1024;
  config.bucket_mb = 2e8 * 2 / (1024.0 * 1024.0);  // an imported DeepSpeed bucket: 381.47 MiB
  config.first_bucket_mb = 0.1;
  config.overlap_comm = false;
  config.data_store = DataStore::kMemory;
  config.data_store_limit_mb = 4096;
  config.checkpoint_every = 500;
  config.checkpoint_every_minutes = 0.1 + 0.2;  // needs 17 digits
  config.optimizer = OptimizerKind::kLamb;
  config.trust_coefficient = 0.02;
  config.min_trust_ratio = 0.01;
  config.max_trust_ratio = 10;
  config.lamb_bias_correction = LambBiasCorrection::kStepSize;
  const std::string text = to_ini(config);
  EXPECT_EQ(text.rfind("# hpc_train resolved configuration\n", 0), 0u) << text;
  // Sections in order, the new ones after [training].
  EXPECT_LT(text.find("\n[training]\n"), text.find("\n[zero]\n")) << text;
  EXPECT_LT(text.find("\n[zero]\n"), text.find("\n[comm]\n")) << text;
  EXPECT_LT(text.find("\n[comm]\n"), text.find("\n[runtime]\n")) << text;
  EXPECT_NE(text.find("\n[zero]\nzero_stage = 2\nprecision = fp16\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("overlap_comm = false\n"), std::string::npos) << text;
  for (const char* section :
       {"[data]", "[model]", "[training]", "[zero]", "[comm]", "[runtime]", "[output]"}) {
    EXPECT_NE(text.find(std::string("\n") + section + "\n"), std::string::npos) << section;
  }
  EXPECT_NE(text.find("drop_last = true\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\noptimizer = lamb\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\ntrust_coefficient = 0.02\nmin_trust_ratio = 0.01\n"
                      "max_trust_ratio = 10\nlamb_bias_correction = step\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("data_store = memory\ndata_store_limit_mb = 4096\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("\n[checkpoint]\ncheckpoint_every = 500\n"
                      "checkpoint_every_minutes = 0.30000000000000004\n"),
            std::string::npos)
      << text;
  expect_same(parse({"--config", write("changed.ini", text)}).config, config);
}

TEST(Config, HelpListsEveryGroupAndOptionWithDefault) {
  const CommandLine command_line = parse({"--help"});
  EXPECT_EQ(command_line.action, CommandLine::Action::kPrintAndExit);
  const std::string& help = command_line.text;
  EXPECT_EQ(parse({"-h"}).text, help);
  for (const char* expected :
       {"Usage: hpc_train [options]", "mpirun -np N hpc_train [options]", "--config FILE",
        "wins over the file", "--version", "General", "Data [data]", "Model [model]",
        "Training [training]", "Runtime [runtime]", "Output [output]",
        "--dataset TEXT (=data/fashion-mnist.h5)", "--drop-last [=true|false] (=false)",
        "--prefetch N (=4)", "--reader-threads N (=8)", "--model TEXT (=simple_cnn)", "--epochs N (=10)",
        "--max-steps N (=0)", "--micro-batch N (=64)", "--optimizer TEXT (=adamw)",
        "--lr X (=0.001)", "--beta1 X (=0.9)", "--beta2 X (=0.999)", "--eps X (=1e-08)",
        "--weight-decay X (=0.01)", "--seed N (=42)", "--threads-per-rank N (=0)",
        "--run-dir TEXT", "--log-every N (=50)", "--progress TEXT (=auto)",
        "--deepspeed-config FILE", "--deepspeed-allow-unknown [=true|false] (=false)",
        "ZeRO and precision [zero]", "Gradient communication [comm]", "--grad-accum N (=1)",
        "--clip-grad X (=0)", "--lr-schedule TEXT (=constant)", "--warmup-steps N (=0)",
        "--warmup-type TEXT (=linear)", "--warmup-start-ratio X (=0)",
        "--cosine-final-ratio X (=0)", "--schedule-steps N (=0)", "--zero-stage N (=0)",
        "--precision TEXT (=fp32)", "--loss-scale X (=0)", "--initial-scale-power N (=16)",
        "--loss-scale-window N (=1000)", "--hysteresis N (=2)", "--min-loss-scale X (=1)",
        "--bucket-mb X (=0)", "--first-bucket-mb X (=1)",
        "--overlap-comm [=true|false] (=true)", "Checkpoints [checkpoint]",
        "--checkpoint-every N (=0)", "--checkpoint-every-minutes X (=0)",
        "--trust-coefficient X (=0.001)", "--min-trust-ratio X (=0)", "--max-trust-ratio X (=0)",
        "--lamb-bias-correction TEXT (=moments)"}) {
    EXPECT_NE(help.find(expected), std::string::npos) << expected << "\n" << help;
  }
}

TEST(Config, HelpListsEveryModel) {
  const std::string help = parse({"--help"}).text;
  const std::string models = help.substr(help.find("--model TEXT"));
  for (const std::string& name : model_names()) {
    // A whole name: after a space or the list's opening bracket, before a comma, a line end or
    // the closing bracket.
    bool listed = false;
    for (const char* before : {" ", "("})
      for (const char* after : {",", "\n", ")"})
        listed = listed || models.find(before + name + after) != std::string::npos;
    EXPECT_TRUE(listed) << name << " is not in --model's help:\n" << help;
  }
}

TEST(Config, Version) {
  // What --version prints is build_info.h's (test_version); the command line only asks for it.
  EXPECT_EQ(parse({"--version"}).action, CommandLine::Action::kPrintBuild);
  EXPECT_EQ(parse({"--version", "--epochs", "2"}).action, CommandLine::Action::kPrintBuild);
}

TEST(Config, CommandLineErrorsNameTheOption) {
  std::string message = parse_error({"--epoch", "3"});
  EXPECT_NE(message.find("unknown option --epoch; did you mean --epochs? See hpc_train --help"),
            std::string::npos) << message;
  message = parse_error({"--micro-bach=3"});
  EXPECT_NE(message.find("--micro-bach; did you mean --micro-batch?"), std::string::npos)
      << message;
  message = parse_error({"--no-such-thing"});
  EXPECT_NE(message.find("unknown option --no-such-thing"), std::string::npos) << message;

  message = parse_error({"--epochs", "ten"});
  EXPECT_NE(message.find("--epochs ten: expected a whole number, e.g. --epochs 10"),
            std::string::npos) << message;
  message = parse_error({"--lr", "fast"});
  EXPECT_NE(message.find("--lr fast: expected a number"), std::string::npos) << message;
  message = parse_error({"--seed", "-1"});
  EXPECT_NE(message.find("--seed -1: expected a whole number >= 0"), std::string::npos)
      << message;
  message = parse_error({"--micro-batch", "99999999999"});
  EXPECT_NE(message.find("--micro-batch 99999999999: out of range"), std::string::npos)
      << message;
  message = parse_error({"--drop-last=maybe"});
  EXPECT_NE(message.find("--drop-last=maybe: expected true or false"), std::string::npos)
      << message;

  message = parse_error({"--epochs"});
  EXPECT_NE(message.find("--epochs"), std::string::npos) << message;
  message = parse_error({"--epochs", "3", "--epochs", "4"});
  EXPECT_NE(message.find("--epochs"), std::string::npos) << message;
  message = parse_error({"train.h5"});
  EXPECT_NE(message.find("unexpected argument 'train.h5'"), std::string::npos) << message;
}

TEST_F(ConfigTest, ConfigFileErrorsNameTheFileAndKey) {
  std::string message = parse_error({"--config", (dir_ / "missing.ini").string()});
  EXPECT_NE(message.find("missing.ini: cannot open"), std::string::npos) << message;
  message = parse_error({"--config", dir_.string()});
  EXPECT_NE(message.find("is a directory"), std::string::npos) << message;

  const std::string unknown_key = write("key.ini", "[training]\nepochs = 3\nepoch = 4\n");
  message = parse_error({"--config", unknown_key});
  EXPECT_NE(message.find(unknown_key + ":3: unknown key 'epoch' in [training]; did you mean "
                                       "epochs?"),
            std::string::npos) << message;

  const std::string unknown_section = write("section.ini", "\n[modle]\nmodel = x\n");
  message = parse_error({"--config", unknown_section});
  EXPECT_NE(message.find(unknown_section + ":3: unknown section [modle]; did you mean [model]?"),
            std::string::npos) << message;

  const std::string wrong_section = write("wrong.ini", "[model]\nepochs = 3\n");
  message = parse_error({"--config", wrong_section});
  EXPECT_NE(message.find(":2: 'epochs' in [model]: epochs belongs under [training]"),
            std::string::npos) << message;

  const std::string no_section = write("nosection.ini", "epochs = 3\n");
  message = parse_error({"--config", no_section});
  EXPECT_NE(message.find(":1: 'epochs' (outside any section)"), std::string::npos) << message;

  const std::string malformed = write("value.ini", "[training]\n\nepochs = ten\n");
  message = parse_error({"--config", malformed});
  EXPECT_NE(message.find(malformed + ":3: epochs = ten in [training]: expected a whole number"),
            std::string::npos) << message;

  const std::string twice = write("twice.ini", "[training]\nlr = 0.1\nlr = 0.2\n");
  message = parse_error({"--config", twice});
  EXPECT_NE(message.find(twice + ":3: 'lr' in [training] was already set on line 2"),
            std::string::npos) << message;

  const std::string bad_line = write("syntax.ini", "[training]\nepochs 3\n");
  message = parse_error({"--config", bad_line});
  EXPECT_NE(message.find(bad_line + ":2: 'epochs 3' is neither"), std::string::npos) << message;
}

// A name that no value of a choice has (config_choices.h) fails where it is read, naming the
// option, the value and the names that would work, on the command line and in the INI file alike.
TEST_F(ConfigTest, UnknownChoiceNamesTheOptionValueAndNames) {
  struct Case {
    const char* option;
    const char* section;
    const char* value;
    const char* names;
    const char* default_name;
  };
  const Case cases[] = {
      {"augment", "data", "sometimes", "auto, on or off", "auto"},
      {"optimizer", "training", "lion", "adamw, adam, sgd, lamb or lars", "adamw"},
      {"lamb-bias-correction", "training", "paper", "moments, step or none", "moments"},
      {"lr-schedule", "training", "cosine",
       "constant, warmup, warmup-cosine, warmup-decay, one-cycle or multistep", "constant"},
      {"warmup-type", "training", "exp", "linear or log", "linear"},
      {"precision", "zero", "fp8", "fp32, fp16 or bf16", "fp32"},
      {"resident-data", "data", "yes", "auto, on or off", "auto"},
      {"data-store", "data", "disk", "file or memory", "file"},
      {"device", "runtime", "gpu", "auto, cuda or cpu", "auto"},
      {"backend", "runtime", "gloo", "auto, nccl, mpi or none", "auto"},
      {"cuda-graph", "runtime", "ON", "auto, on or off", "auto"},
      {"progress", "output", "fancy", "auto, bar or lines", "auto"},
      {"grad-accum-dtype", "zero", "bf16", "model or fp32", "model"},
      {"comm-dtype", "comm", "FP32", "model or fp32", "model"},
  };
  for (const Case& bad : cases) {
    const std::string option = bad.option;
    EXPECT_EQ(parse_error({"--" + option, bad.value}),
              "--" + option + " " + bad.value + ": must be " + bad.names + ", e.g. --" + option +
                  " " + bad.default_name + ". See hpc_train --help");
    std::string key = option;
    std::replace(key.begin(), key.end(), '-', '_');
    const std::string path = write(
        "choice.ini", std::string("[") + bad.section + "]\n" + key + " = " + bad.value + "\n");
    EXPECT_EQ(parse_error({"--config", path}),
              path + ":2: " + key + " = " + bad.value + " in [" + bad.section + "]: must be " +
                  bad.names + ", e.g. " + key + " = " + bad.default_name);
  }
}

TEST(Config, ValidateNamesTheOptionAndValue) {
  struct Case {
    std::function<void(TrainConfig&)> change;
    std::string expected;
  };
  const Case cases[] = {
      {[](TrainConfig& c) { c.epochs = 0; }, "--epochs 0: must be at least 1"},
      {[](TrainConfig& c) { c.max_steps = -1; }, "--max-steps -1:"},
      {[](TrainConfig& c) { c.micro_batch = 0; },
       "--micro-batch 0: must be at least 1 (samples per rank per step)"},
      {[](TrainConfig& c) { c.prefetch_batches = 0; }, "--prefetch 0:"},
      {[](TrainConfig& c) { c.eval_batch = -1; },
       "--eval-batch -1: must be 0 (sized by the sample) or more (samples per rank per "
       "evaluation batch)"},
      {[](TrainConfig& c) { c.lr = 0; }, "--lr 0:"},
      {[](TrainConfig& c) { c.lr = -0.001; }, "--lr -0.001:"},
      {[](TrainConfig& c) { c.lr = std::numeric_limits<double>::infinity(); }, "--lr inf:"},
      {[](TrainConfig& c) { c.lr = std::nan(""); }, "--lr nan:"},
      {[](TrainConfig& c) { c.beta1 = 1.0; }, "--beta1 1:"},
      {[](TrainConfig& c) { c.beta1 = -0.1; }, "--beta1 -0.1:"},
      {[](TrainConfig& c) { c.beta2 = 1.5; }, "--beta2 1.5:"},
      {[](TrainConfig& c) { c.eps = 0; }, "--eps 0:"},
      {[](TrainConfig& c) { c.weight_decay = -1; }, "--weight-decay -1:"},
      {[](TrainConfig& c) { c.log_every = 0; }, "--log-every 0:"},
      {[](TrainConfig& c) { c.threads_per_rank = -2; }, "--threads-per-rank -2:"},
      {[](TrainConfig& c) { c.dataset_path.clear(); }, "--dataset '':"},
      {[](TrainConfig& c) { c.model.clear(); }, "--model '':"},
      {[](TrainConfig& c) { c.grad_accum = 0; }, "--grad-accum 0: must be at least 1"},
      {[](TrainConfig& c) { c.clip_grad = -1; }, "--clip-grad -1: must be a finite number >= 0"},
      {[](TrainConfig& c) { c.clip_grad = std::numeric_limits<double>::infinity(); },
       "--clip-grad inf:"},
      {[](TrainConfig& c) { c.warmup_steps = -5; }, "--warmup-steps -5:"},
      {[](TrainConfig& c) { c.warmup_start_ratio = 1.5; }, "--warmup-start-ratio 1.5: must be in "
                                                           "[0, 1]"},
      {[](TrainConfig& c) { c.warmup_start_ratio = std::nan(""); }, "--warmup-start-ratio nan:"},
      {[](TrainConfig& c) { c.cosine_final_ratio = -0.1; }, "--cosine-final-ratio -0.1:"},
      {[](TrainConfig& c) { c.schedule_steps = -1; }, "--schedule-steps -1:"},
      {[](TrainConfig& c) { c.momentum = 0.9; },
       "--momentum 0.9: applies to --optimizer sgd and lars only (Adam's and LAMB's momentum is "
       "--beta1)"},
      {[](TrainConfig& c) {
         c.optimizer = OptimizerKind::kLamb;
         c.dampening = 0.1;
       },
       "--dampening 0.1: applies to --optimizer sgd and lars only"},
      {[](TrainConfig& c) { c.nesterov = true; },
       "--nesterov true: applies to --optimizer sgd and lars only"},
      {[](TrainConfig& c) {
         c.optimizer = OptimizerKind::kLars;
         c.nesterov = true;
       },
       "--nesterov true: needs --momentum > 0"},
      {[](TrainConfig& c) {
         c.optimizer = OptimizerKind::kLars;
         c.momentum = 0.9;
         c.nesterov = true;
         c.lr_schedule = LrScheduleKind::kOneCycle;
         c.cycle_min_momentum = 0;
       },
       "--cycle-min-momentum 0: must be > 0 with --nesterov"},
      {[](TrainConfig& c) {
         c.optimizer = OptimizerKind::kLars;
         c.trust_coefficient = 0;
       },
       "--trust-coefficient 0: must be a finite number > 0, e.g. 0.001"},
      {[](TrainConfig& c) { c.trust_coefficient = -1e-3; }, "--trust-coefficient -0.001: must be"},
      {[](TrainConfig& c) { c.trust_coefficient = std::nan(""); }, "--trust-coefficient nan:"},
      {[](TrainConfig& c) { c.trust_coefficient = std::numeric_limits<double>::infinity(); },
       "--trust-coefficient inf:"},
      {[](TrainConfig& c) {
         c.optimizer = OptimizerKind::kLamb;
         c.min_trust_ratio = -0.01;
       },
       "--min-trust-ratio -0.01: must be a finite number >= 0 (0 = no lower bound)"},
      {[](TrainConfig& c) { c.min_trust_ratio = std::numeric_limits<double>::infinity(); },
       "--min-trust-ratio inf: must be a finite number >= 0"},
      {[](TrainConfig& c) {
         c.optimizer = OptimizerKind::kLamb;
         c.min_trust_ratio = 0.5;
         c.max_trust_ratio = 0.1;
       },
       "--max-trust-ratio 0.1: must be 0 (no upper bound) or a finite number >= "
       "--min-trust-ratio (0.5), e.g. 10"},
      {[](TrainConfig& c) { c.max_trust_ratio = -1; }, "--max-trust-ratio -1: must be 0"},
      {[](TrainConfig& c) { c.max_trust_ratio = std::numeric_limits<double>::infinity(); },
       "--max-trust-ratio inf: must be 0"},
      {[](TrainConfig& c) { c.max_trust_ratio = std::nan(""); }, "--max-trust-ratio nan: must be 0"},
      {[](TrainConfig& c) {
         c.optimizer = OptimizerKind::kLamb;
         c.trust_coefficient = 0.02;
       },
       "--trust-coefficient 0.02: applies to --optimizer lars only"},
      {[](TrainConfig& c) { c.min_trust_ratio = 0.01; },
       "--min-trust-ratio 0.01: applies to --optimizer lamb only"},
      {[](TrainConfig& c) {
         c.optimizer = OptimizerKind::kLars;
         c.max_trust_ratio = 10;
       },
       "--max-trust-ratio 10: applies to --optimizer lamb only"},
      {[](TrainConfig& c) { c.lamb_bias_correction = LambBiasCorrection::kStepSize; },
       "--lamb-bias-correction step: applies to --optimizer lamb only"},
      {[](TrainConfig& c) {
         c.optimizer = OptimizerKind::kSgd;
         c.momentum = 1.0;
       },
       "--momentum 1: must be in [0, 1)"},
      {[](TrainConfig& c) {
         c.optimizer = OptimizerKind::kSgd;
         c.momentum = 0.9;
         c.dampening = 0.1;
         c.nesterov = true;
       },
       "--nesterov true: needs --momentum > 0 and --dampening 0"},
      {[](TrainConfig& c) {
         c.optimizer = OptimizerKind::kSgd;
         c.nesterov = true;
       },
       "--nesterov true: needs --momentum > 0"},
      {[](TrainConfig& c) { c.cycle_min_ratio = 2; }, "--cycle-min-ratio 2: must be in [0, 1]"},
      {[](TrainConfig& c) { c.cycle_first_steps = -3; }, "--cycle-first-steps -3:"},
      {[](TrainConfig& c) { c.cycle_max_momentum = 1; }, "--cycle-min-momentum 0.8: needs"},
      {[](TrainConfig& c) { c.lr_gamma = 0; }, "--lr-gamma 0: must be in (0, 1]"},
      {[](TrainConfig& c) { c.lr_schedule = LrScheduleKind::kMultiStep; },
       "--lr-schedule multistep: multistep needs either --lr-milestones"},
      {[](TrainConfig& c) { c.lr_milestones = "100"; },
       "--lr-milestones '100': applies to --lr-schedule multistep only"},
      {[](TrainConfig& c) {
         c.lr_schedule = LrScheduleKind::kMultiStep;
         c.lr_milestones = "300,200";
       },
       "--lr-milestones 300,200: '200' is not an optimizer step >= 1 in ascending order"},
      {[](TrainConfig& c) {
         c.lr_schedule = LrScheduleKind::kMultiStep;
         c.lr_milestones = "10,x";
       },
       "--lr-milestones 10,x: 'x' is not an optimizer step"},
      {[](TrainConfig& c) {
         c.lr_schedule = LrScheduleKind::kMultiStep;
         c.lr_milestone_epochs = "30,0";
       },
       "--lr-milestone-epochs 30,0: '0' is not an epoch >= 1 in ascending order"},
      {[](TrainConfig& c) {
         c.lr_schedule = LrScheduleKind::kMultiStep;
         c.lr_milestones = "100";
         c.lr_milestone_epochs = "3";
       },
       "--lr-schedule multistep: multistep needs either --lr-milestones (optimizer steps"},
      {[](TrainConfig& c) { c.lr_milestone_epochs = "3"; },
       "--lr-milestone-epochs '3': applies to --lr-schedule multistep only"},
      {[](TrainConfig& c) {
         c.lr_schedule = LrScheduleKind::kWarmupCosine;
         c.warmup_steps = 100;
         c.schedule_steps = 50;
       },
       "--schedule-steps 50: the cosine would end before the warm-up (--warmup-steps 100)"},
      {[](TrainConfig& c) { c.zero_stage = 3; },
       "--zero-stage 3: must be 0, 1 or 2 (stage 3, which partitions the parameters too, is not "
       "supported)"},
      {[](TrainConfig& c) { c.zero_stage = -1; }, "--zero-stage -1:"},
      {[](TrainConfig& c) { c.loss_scale = -1; }, "--loss-scale -1: must be 0 (dynamic)"},
      {[](TrainConfig& c) { c.initial_scale_power = 65; }, "--initial-scale-power 65: must be in "
                                                           "[0, 64]"},
      {[](TrainConfig& c) { c.initial_scale_power = -1; }, "--initial-scale-power -1:"},
      {[](TrainConfig& c) { c.loss_scale_window = 0; }, "--loss-scale-window 0: must be at least "
                                                        "1"},
      {[](TrainConfig& c) { c.hysteresis = 0; }, "--hysteresis 0: must be at least 1"},
      {[](TrainConfig& c) { c.min_loss_scale = 0; }, "--min-loss-scale 0: must be a finite "
                                                     "number > 0"},
      {[](TrainConfig& c) { c.bucket_mb = -1; }, "--bucket-mb -1: must be 0 (chosen by the ZeRO "
                                               "stage) or a number of MiB"},
      {[](TrainConfig& c) { c.bucket_mb = std::nan(""); }, "--bucket-mb nan:"},
      {[](TrainConfig& c) { c.first_bucket_mb = -1; }, "--first-bucket-mb -1:"},
      {[](TrainConfig& c) { c.cuda_profiler_start_step = -1; },
       "--cuda-profiler-start-step -1: must be 0 (never) or a step number"},
      {[](TrainConfig& c) { c.cuda_profiler_steps = 0; }, "--cuda-profiler-steps 0: must be at "
                                                          "least 1"},
      {[](TrainConfig& c) { c.deterministic = c.cudnn_benchmark = true; },
       "--cudnn-benchmark true: cannot be combined with --deterministic"},
      {[](TrainConfig& c) { c.checkpoint_every = -1; }, "--checkpoint-every -1: must be 0 (off)"},
      {[](TrainConfig& c) { c.checkpoint_every_minutes = -1; },
       "--checkpoint-every-minutes -1: must be 0 (off) or a finite number of minutes > 0"},
      {[](TrainConfig& c) { c.checkpoint_every_minutes = std::nan(""); },
       "--checkpoint-every-minutes nan:"},
      {[](TrainConfig& c) { c.checkpoint_every_minutes = std::numeric_limits<double>::infinity(); },
       "--checkpoint-every-minutes inf:"},
      {[](TrainConfig& c) { c.data_store_limit_mb = -1; }, "--data-store-limit-mb -1: must be 0"},
      {[](TrainConfig& c) { c.data_store_limit_mb = (int64_t{1} << 40) + 1; },
       "--data-store-limit-mb 1099511627777: must be 0"},
      {[](TrainConfig& c) {
         c.data_store = DataStore::kMemory;
         c.resident_data = Switch::kOn;
       },
       "--data-store memory: cannot be combined with --resident-data on"},
  };
  for (const Case& bad : cases) {
    TrainConfig config;
    bad.change(config);
    const std::string message = config_error([&] { validate(config); });
    EXPECT_NE(message.find(bad.expected), std::string::npos) << message;
  }
  TrainConfig edges;  // the ends of each range that still work
  edges.beta1 = 0;
  edges.beta2 = 0;
  edges.weight_decay = 0;
  edges.max_steps = 0;
  edges.threads_per_rank = 0;
  edges.optimizer = OptimizerKind::kAdam;
  edges.progress = ProgressStyle::kBar;
  edges.clip_grad = 0;
  edges.warmup_start_ratio = 1;
  edges.cosine_final_ratio = 1;
  edges.initial_scale_power = 64;
  edges.loss_scale_window = 1;
  edges.hysteresis = 1;
  edges.zero_stage = 2;
  edges.precision = Precision::kBf16;
  edges.lr_schedule = LrScheduleKind::kWarmupCosine;
  edges.warmup_steps = 100;
  edges.schedule_steps = 100;  // a cosine that ends where the warm-up does
  edges.warmup_type = WarmupType::kLog;
  edges.checkpoint_every_minutes = 1e-9;  // any finite time > 0, however short
  EXPECT_NO_THROW(validate(edges));
  edges.schedule_steps = 0;  // the whole run, resolved by the trainer
  EXPECT_NO_THROW(validate(edges));

  TrainConfig lamb;  // a fixed trust ratio, and a lower bound without an upper one
  lamb.optimizer = OptimizerKind::kLamb;
  lamb.lamb_bias_correction = LambBiasCorrection::kNone;
  lamb.min_trust_ratio = lamb.max_trust_ratio = 0.5;
  EXPECT_NO_THROW(validate(lamb));
  lamb.max_trust_ratio = 0;
  EXPECT_NO_THROW(validate(lamb));
  TrainConfig lars;  // SGD's momentum options, a cycled momentum with Nesterov's variant
  lars.optimizer = OptimizerKind::kLars;
  lars.trust_coefficient = 1e-9;
  lars.momentum = 0.9;
  lars.nesterov = true;
  lars.lr_schedule = LrScheduleKind::kOneCycle;
  EXPECT_NO_THROW(validate(lars));
  lars.nesterov = false;
  lars.dampening = 1;
  EXPECT_NO_THROW(validate(lars));
}

// A minimum loss scale above the dynamic scale's start, and bucket sizes that are no byte or
// beyond any model (1e6 MiB), are refused; their edges are fine.
TEST(Config, ValidateBoundsLossScaleAndBuckets) {
  const auto error = [](const std::function<void(TrainConfig&)>& change) {
    TrainConfig config;
    change(config);
    return config_error([&] { validate(config); });
  };
  EXPECT_EQ(error([](TrainConfig& c) { c.min_loss_scale = 131072; }),
            "--min-loss-scale 131072: must not exceed the dynamic loss scale's start, 2^16 = "
            "65536 (--initial-scale-power); give at most 65536 or a larger "
            "--initial-scale-power");
  EXPECT_NE(error([](TrainConfig& c) {
              c.initial_scale_power = 3;
              c.min_loss_scale = 8.5;
            }).find("--min-loss-scale 8.5: must not exceed the dynamic loss scale's start, 2^3 = "
                    "8 "),
            std::string::npos);
  EXPECT_EQ(error([](TrainConfig& c) { c.bucket_mb = 2e6; }),
            "--bucket-mb 2000000: must be 0 (chosen by the ZeRO stage) or a number of MiB from "
            "2^-20 (one byte) to 1e6, e.g. 25");
  EXPECT_NE(error([](TrainConfig& c) { c.bucket_mb = 1e-7; }).find("--bucket-mb 1e-07: must be"),
            std::string::npos);  // 0 bytes: no bucket could hold a gradient
  EXPECT_NE(error([](TrainConfig& c) { c.bucket_mb = std::numeric_limits<double>::infinity(); })
                .find("--bucket-mb inf: must be"),
            std::string::npos);
  EXPECT_EQ(error([](TrainConfig& c) { c.first_bucket_mb = 1e300; }),
            "--first-bucket-mb 1e+300: must be a number of MiB from 2^-20 (one byte) to 1e6, "
            "e.g. 1");

  TrainConfig edges;
  edges.min_loss_scale = 65536;  // = 2^16: the scale may start at its minimum
  edges.bucket_mb = 1e6;
  edges.first_bucket_mb = 1.0 / (1 << 20);
  EXPECT_NO_THROW(validate(edges));
  edges.min_loss_scale = 1e9;  // a fixed scale: the dynamic options play no part
  edges.loss_scale = 1024;
  EXPECT_NO_THROW(validate(edges));
}

DatasetInfo dataset_of(int64_t train_size, int64_t channels = 1, int64_t height = 28,
                       int64_t width = 28) {
  DatasetInfo info;
  info.num_classes = 10;
  info.channels = channels;
  info.height = height;
  info.width = width;
  info.train_size = train_size;
  info.test_size = 100;
  return info;
}

// Note [Rank's share of the train split]: every rank gets ceil(N / W) samples (padded) or
// floor(N / W) (--drop-last), and the micro-batch may be at most that.
TEST(Config, ValidateForDatasetMicroBatchAgainstTheRanksShare) {
  constexpr int64_t kMemory = int64_t{1} << 40;
  const auto error = [&](int64_t train_size, int world_size, int micro_batch, bool drop_last) {
    TrainConfig config;
    config.micro_batch = micro_batch;
    config.drop_last = drop_last;
    return config_error([&] {
      validate_for_dataset(config, dataset_of(train_size), "data.h5", world_size, kMemory, true);
    });
  };
  const auto fits = [&](int64_t train_size, int world_size, int micro_batch, bool drop_last) {
    TrainConfig config;
    config.micro_batch = micro_batch;
    config.drop_last = drop_last;
    validate_for_dataset(config, dataset_of(train_size), "data.h5", world_size, kMemory, true);
  };
  EXPECT_EQ(error(600, 3, 201, false),
            "--micro-batch 201: more than each rank's share of the train split of data.h5 (600 "
            "samples): 3 ranks get 200 samples each, so every micro-batch would be partial and "
            "no step would have the global batch of micro-batch x grad-accum x ranks; use "
            "--micro-batch 200 or less, or fewer ranks");
  EXPECT_NO_THROW(fits(600, 3, 200, false));  // one full micro-batch a rank and epoch
  EXPECT_NO_THROW(fits(600, 3, 200, true));
  // 601 over 3: 201 each, padded with 2 repeats; or 200 each, dropping 1.
  EXPECT_NE(error(601, 3, 202, false)
                .find("3 ranks get 201 samples each, padded by repeating 2 of them, so every"),
            std::string::npos);
  EXPECT_NO_THROW(fits(601, 3, 201, false));
  EXPECT_NE(error(601, 3, 201, true)
                .find("3 ranks get 200 samples each, --drop-last drops the other 1, so every "
                      "micro-batch would be partial"),
            std::string::npos);
  // Fewer samples than ranks: padded, each rank gets 1; dropped, none.
  EXPECT_NO_THROW(fits(2, 3, 1, false));
  EXPECT_NE(error(2, 3, 2, false).find("--micro-batch 2: more than each rank's share"),
            std::string::npos);
  EXPECT_EQ(error(2, 3, 1, true),
            "--drop-last: the train split of data.h5 (2 samples) has fewer samples than the 3 "
            "ranks, so dropping the tail that the ranks cannot share evenly leaves every rank "
            "none; use fewer ranks, or leave out --drop-last");
  EXPECT_NO_THROW(fits(1, 1, 1, true));
}

// Note [Input memory bound]: (queued + 1 + 4) bytes a sample byte for a micro-batch, queued =
// min(--prefetch, the epoch's micro-batches); the resident split on the host, N x (C x H x W + 8).
TEST(Config, ValidateForDatasetInputMemory) {
  TrainConfig config;  // micro-batch 64, --prefetch 4
  const DatasetInfo info = dataset_of(600);  // 1x28x28: 200 samples a rank at 3 ranks
  // Accepted with exactly `bytes` of memory; the error one byte short.
  const auto error_one_byte_short = [&](const TrainConfig& checked, int64_t bytes) {
    EXPECT_NO_THROW(validate_for_dataset(checked, info, "data.h5", 3, bytes, true));
    return config_error(
        [&] { validate_for_dataset(checked, info, "data.h5", 3, bytes - 1, true); });
  };
  const int64_t batch_bytes = 64 * 784 * (4 + 1 + 4);  // 451584
  EXPECT_EQ(error_one_byte_short(config, batch_bytes),
            "--micro-batch 64: the input of a batch of data.h5's 1x28x28 samples (784 B "
            "each) needs at least 441 KiB of host memory (the loader's queue, the batch being "
            "read and its float32 copy), more than this node's 441 KiB; use a smaller "
            "--micro-batch or --prefetch");
  // The queue never holds more than an epoch's micro-batches: 4 of 64 at 200 samples a rank.
  config.prefetch_batches = std::numeric_limits<int>::max();
  EXPECT_NO_THROW(validate_for_dataset(config, info, "data.h5", 3, batch_bytes, true));

  // One sample alone (1x2^20x2^20, 1 TiB) is beyond the node: no option helps, the data is
  // refused (exit 3).
  config = TrainConfig{};
  config.micro_batch = 1;
  try {
    validate_for_dataset(config, dataset_of(600, 1, 1 << 20, 1 << 20), "huge.h5", 3,
                         int64_t{64} << 30, true);
    ADD_FAILURE() << "no DataError";
  } catch (const DataError& e) {
    EXPECT_EQ(std::string(e.what()),
              "huge.h5: one sample of 1x1048576x1048576 (channels x height x width) is 1 TiB; "
              "the input of a micro-batch of 1 needs at least 9 TiB of host memory, more than "
              "this node's 64 GiB");
  }

  // An --eval-batch given outright, from a rank's share of the test split (100 samples: 34 on
  // rank 0 at 3 ranks): 34 x 784 x (1 queued + 1 + 4), whatever larger batch is asked; auto (0)
  // is not checked here (it is bounded by construction, run_options.h evaluation_batch).
  config = TrainConfig{};
  config.micro_batch = 1;  // 7056 bytes: below every bound here
  config.eval_batch = 1000;
  const int64_t eval_bytes = 34 * 784 * (1 + 1 + 4);  // 159936
  EXPECT_EQ(error_one_byte_short(config, eval_bytes),
            "--eval-batch 1000: the input of a batch of data.h5's 1x28x28 samples (784 B each) "
            "needs at least 156.2 KiB of host memory (the loader's queue, the batch being read "
            "and its float32 copy), more than this node's 156.2 KiB; use a smaller --eval-batch "
            "or --prefetch, or 0 (sized by the sample)");
  config.eval_batch = 10;  // 4 queued of 4 batches: 10 x 784 x 9 = 70560
  EXPECT_NO_THROW(validate_for_dataset(config, info, "data.h5", 3, 70560, true));
  EXPECT_THROW(validate_for_dataset(config, info, "data.h5", 3, 70559, true), ConfigError);

  // A train split kept resident in host memory: 600 x (784 + 8) = 475200 bytes.
  config = TrainConfig{};
  config.micro_batch = 8;
  config.resident_data = Switch::kOn;
  EXPECT_NO_THROW(validate_for_dataset(config, info, "data.h5", 3, 475200, true));
  EXPECT_EQ(config_error([&] { validate_for_dataset(config, info, "data.h5", 3, 475199, true); }),
            "--resident-data on: the train split of data.h5 (600 samples) of 1x28x28 images "
            "needs 464.1 KiB of host memory to stay resident (this run computes on the CPU), "
            "more than this node's 464.1 KiB; use --resident-data off");
  // On a GPU the split lives in device memory, uploaded in chunks: not the host's concern.
  EXPECT_NO_THROW(validate_for_dataset(config, info, "data.h5", 3, 475199, false));
}

// --init-weights and --init-weights-partial: read from the command line and INI, written back,
// and validated (a .safetensors file; partial only with a file).
TEST_F(ConfigTest, InitialWeightsOptions) {
  const TrainConfig c =
      parse({"--model", "nets/net.pt", "--init-weights", "w.safetensors", "--init-weights-partial"})
          .config;
  EXPECT_EQ(c.model, "nets/net.pt");
  EXPECT_EQ(c.init_weights, "w.safetensors");
  EXPECT_TRUE(c.init_weights_partial);
  EXPECT_NO_THROW(validate(c));
  const std::string text = to_ini(c);
  EXPECT_NE(text.find("\n[model]\nmodel = nets/net.pt\ninit_weights = w.safetensors\n"
                      "init_weights_partial = true\n"),
            std::string::npos)
      << text;
  expect_same(parse({"--config", write("init.ini", text)}).config, c);

  TrainConfig config;
  config.init_weights = "w.pt";
  EXPECT_EQ(config_error([&] { validate(config); }),
            "--init-weights 'w.pt': must name a .safetensors file (a PyTorch state_dict saved "
            "with safetensors.torch.save_file, or an --export-weights file)");
  config.init_weights = ".safetensors";
  EXPECT_NE(config_error([&] { validate(config); }), "");
  config.init_weights = "";
  config.init_weights_partial = true;
  EXPECT_EQ(config_error([&] { validate(config); }),
            "--init-weights-partial true: needs --init-weights FILE.safetensors");
}

}  // namespace
}  // namespace hpc_train

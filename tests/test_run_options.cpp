// The run's decisions from the configuration (run_options.h): which steps cuDNN autotunes,
// when steps are captured as a CUDA graph, when the train split stays on the GPU; what the
// optimizer is given.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "hpc_train/data/dataset_file.h"
#include "hpc_train/error.h"
#include "hpc_train/train/run_options.h"

namespace {

using hpc_train::TrainConfig;

TEST(RunOptions, CudnnAutotunesTheFullMicroBatchOnly) {
  TrainConfig config;
  config.micro_batch = 256;
  EXPECT_FALSE(hpc_train::cudnn_autotunes(config, 256));  // --cudnn-benchmark off
  config.cudnn_benchmark = true;
  EXPECT_TRUE(hpc_train::cudnn_autotunes(config, 256));
  EXPECT_FALSE(hpc_train::cudnn_autotunes(config, 32));  // an epoch's partial last batch
}

TEST(RunOptions, CaptureStepsNeedsAGpuAndRefusesOnWithoutOne) {
  TrainConfig config;
  hpc_train::Placement cpu;  // no GPU, the MPI backend
  config.cuda_graph = hpc_train::Switch::kAuto;
  EXPECT_FALSE(hpc_train::capture_steps(config, cpu));
  config.cuda_graph = hpc_train::Switch::kOn;
  EXPECT_THROW(hpc_train::capture_steps(config, cpu), hpc_train::ConfigError);
  config.cuda_graph = hpc_train::Switch::kOff;
  EXPECT_FALSE(hpc_train::capture_steps(config, cpu));
}

constexpr int64_t kGiB = int64_t{1} << 30;

// Note [Resident splits and GPU memory]
TEST(RunOptions, ResidentTrainSplit) {
  using hpc_train::keep_train_split_resident;
  hpc_train::DatasetInfo small;
  small.channels = 3;
  small.height = small.width = 32;
  small.train_size = 50000;  // CIFAR-10: 154 MB
  hpc_train::DatasetInfo large = small;
  large.train_size = hpc_train::kAutoResidentBytes / (3 * 32 * 32);  // just over, with labels
  const std::optional<hpc_train::GpuMemory> cpu;
  const hpc_train::GpuMemory h100{70 * kGiB, 80 * kGiB};
  TrainConfig config;
  config.resident_data = hpc_train::Switch::kAuto;
  EXPECT_TRUE(keep_train_split_resident(config, small, h100));
  EXPECT_FALSE(keep_train_split_resident(config, small, cpu));
  EXPECT_FALSE(keep_train_split_resident(config, large, h100));
  // A quarter of a small card's memory bounds auto, and half of what is free: 154 MB of CIFAR-10
  // stays off a 512 MiB card, and off a large one with 256 MiB free.
  EXPECT_TRUE(keep_train_split_resident(config, small, hpc_train::GpuMemory{kGiB, 2 * kGiB}));
  EXPECT_FALSE(keep_train_split_resident(config, small, hpc_train::GpuMemory{kGiB / 2, kGiB / 2}));
  EXPECT_FALSE(keep_train_split_resident(config, small, hpc_train::GpuMemory{kGiB / 4, 80 * kGiB}));
  config.data_store = hpc_train::DataStore::kMemory;  // Note [Store and resident data]
  EXPECT_FALSE(keep_train_split_resident(config, small, h100));
  config.resident_data = hpc_train::Switch::kOn;
  EXPECT_TRUE(keep_train_split_resident(config, large, cpu));  // the host's memory: config.cpp
  EXPECT_TRUE(keep_train_split_resident(config, large, h100));
  config.resident_data = hpc_train::Switch::kOff;
  EXPECT_FALSE(keep_train_split_resident(config, small, h100));
}

// --resident-data on where the split cannot fit the GPU's free memory is refused before the
// upload, naming both sizes and the remedy; the test split follows only where both fit.
TEST(RunOptions, ResidentDataOnBeyondTheGpusFreeMemoryIsRefused) {
  hpc_train::DatasetInfo info;
  info.channels = 3;
  info.height = info.width = 32;
  info.train_size = 50000;  // 50000 x (3072 + 8) bytes = 146.9 MiB
  info.test_size = 10000;   // 29.4 MiB
  TrainConfig config;
  config.resident_data = hpc_train::Switch::kOn;
  const hpc_train::GpuMemory busy{100 << 20, 16 * kGiB};  // 100 MiB free
  try {
    hpc_train::keep_train_split_resident(config, info, busy);
    FAIL() << "expected a ConfigError";
  } catch (const hpc_train::ConfigError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("--resident-data on"), std::string::npos) << message;
    EXPECT_NE(message.find("50000 samples of 3x32x32"), std::string::npos) << message;
    EXPECT_NE(message.find("146.9 MiB"), std::string::npos) << message;
    EXPECT_NE(message.find("100 MiB free"), std::string::npos) << message;
    EXPECT_NE(message.find("use --resident-data auto or off"), std::string::npos) << message;
  }
  EXPECT_THROW(hpc_train::keep_test_split_resident(config, info, busy), hpc_train::ConfigError);
  // The train split fits, both do not: evaluation reads the test split from the file.
  const hpc_train::GpuMemory tight{160 << 20, 16 * kGiB};
  EXPECT_TRUE(hpc_train::keep_train_split_resident(config, info, tight));
  EXPECT_FALSE(hpc_train::keep_test_split_resident(config, info, tight));
  const hpc_train::GpuMemory roomy{kGiB, 16 * kGiB};
  EXPECT_TRUE(hpc_train::keep_test_split_resident(config, info, roomy));
  config.resident_data = hpc_train::Switch::kAuto;  // auto never throws: it keeps nothing here
  EXPECT_FALSE(hpc_train::keep_train_split_resident(config, info, busy));
}

// Note [Evaluation batch]: auto on a GPU from the float32 input's bytes, within [256, 4096], on
// the CPU 256; a given --eval-batch as is; neither beyond rank 0's share of the test split.
TEST(RunOptions, EvaluationBatch) {
  hpc_train::DatasetInfo fashion;  // 1x28x28: 3136 bytes of float32
  fashion.channels = 1;
  fashion.height = fashion.width = 28;
  fashion.test_size = 10000;
  hpc_train::DatasetInfo cifar = fashion;  // 3x32x32: 12288 bytes
  cifar.channels = 3;
  cifar.height = cifar.width = 32;
  hpc_train::DatasetInfo imagenet = cifar;  // 3x224x224: 602112 bytes
  imagenet.height = imagenet.width = 224;
  TrainConfig config;
  EXPECT_EQ(hpc_train::evaluation_batch(config, fashion, 1, true), 4096);  // 5349, capped
  EXPECT_EQ(hpc_train::evaluation_batch(config, fashion, 3, true), 3334);  // rank 0's share
  EXPECT_EQ(hpc_train::evaluation_batch(config, cifar, 1, true), 1365);    // 16 MiB / 12288
  EXPECT_EQ(hpc_train::evaluation_batch(config, imagenet, 1, true), 256);  // 27, raised
  EXPECT_EQ(hpc_train::evaluation_batch(config, fashion, 1, /*cuda=*/false), 256);
  hpc_train::DatasetInfo no_test = fashion;
  no_test.test_size = 0;
  EXPECT_EQ(hpc_train::evaluation_batch(config, no_test, 2, true), 1);
  config.eval_batch = 7;
  EXPECT_EQ(hpc_train::evaluation_batch(config, imagenet, 1, true), 7);
  config.eval_batch = 3000;
  EXPECT_EQ(hpc_train::evaluation_batch(config, fashion, 1, /*cuda=*/false), 3000);
  config.eval_batch = 100000;
  EXPECT_EQ(hpc_train::evaluation_batch(config, fashion, 4, true), 2500);
}

// Note [Bucket size at ZeRO-2]: --bucket-mb 0 is 25 MiB, but where ZeRO-2 partitions the
// gradients (stage 2 across ranks) an eighth of the gradient bytes, at most 4 MiB; a given size is
// kept at every stage.
TEST(RunOptions, BucketSizeFollowsTheStageUnlessGiven) {
  TrainConfig config;
  const int64_t resnet50_bf16 = 51'000'000, simple_cnn_fp32 = 6'520'360;
  for (int stage : {0, 1, 2}) {
    config.zero_stage = stage;
    EXPECT_EQ(hpc_train::bucket_mib(config, 1, resnet50_bf16), 25.0) << "stage " << stage;
    EXPECT_EQ(hpc_train::bucket_mib(config, 3, resnet50_bf16), stage == 2 ? 4.0 : 25.0);
    EXPECT_DOUBLE_EQ(hpc_train::bucket_mib(config, 3, simple_cnn_fp32),
                     stage == 2 ? simple_cnn_fp32 / 8.0 / (1 << 20) : 25.0);
  }
  config.precision = hpc_train::Precision::kBf16;  // 1,000 bf16 gradients: 250 bytes a bucket
  EXPECT_EQ(hpc_train::reducer_options(config, 3, 1000).bucket_bytes, 250);
  config.comm_dtype = hpc_train::GradientDtype::kFp32;  // the collectives move fp32
  EXPECT_EQ(hpc_train::reducer_options(config, 3, 1000).bucket_bytes, 500);
  config.bucket_mb = 25.0;
  EXPECT_EQ(hpc_train::bucket_mib(config, 3, resnet50_bf16), 25.0) << "given: kept at stage 2";
}

// Every option of the update rules reaches OptimizerOptions (optimizer.h), LAMB's and LARS's too.
TEST(RunOptions, OptimizerOptionsCarryEveryRulesOptions) {
  TrainConfig config;
  config.optimizer = hpc_train::OptimizerKind::kLamb;
  config.lr = 0.02;
  config.beta1 = 0.8;
  config.beta2 = 0.99;
  config.eps = 1e-6;
  config.weight_decay = 0.1;
  config.min_trust_ratio = 0.01;
  config.max_trust_ratio = 10;
  config.lamb_bias_correction = hpc_train::LambBiasCorrection::kStepSize;
  hpc_train::OptimizerOptions options = hpc_train::optimizer_options(config);
  EXPECT_EQ(options.kind, hpc_train::OptimizerKind::kLamb);
  EXPECT_EQ(options.lr, 0.02);
  EXPECT_EQ(options.beta1, 0.8);
  EXPECT_EQ(options.beta2, 0.99);
  EXPECT_EQ(options.eps, 1e-6);
  EXPECT_EQ(options.weight_decay, 0.1);
  EXPECT_EQ(options.min_trust_ratio, 0.01);
  EXPECT_EQ(options.max_trust_ratio, 10.0);
  EXPECT_EQ(options.lamb_bias_correction, hpc_train::LambBiasCorrection::kStepSize);

  config = TrainConfig{};
  config.optimizer = hpc_train::OptimizerKind::kLars;
  config.momentum = 0.9;
  config.dampening = 0.1;
  config.nesterov = true;
  config.trust_coefficient = 0.02;
  options = hpc_train::optimizer_options(config);
  EXPECT_EQ(options.kind, hpc_train::OptimizerKind::kLars);
  EXPECT_EQ(options.momentum, 0.9);
  EXPECT_EQ(options.dampening, 0.1);
  EXPECT_TRUE(options.nesterov);
  EXPECT_EQ(options.trust_coefficient, 0.02);
}

}  // namespace

// --lr-milestone-epochs become the optimizer steps that end those epochs; with --grad-accum the
// micro-steps carry over epoch boundaries, so an epoch's end falls inside the update it ends in.
TEST(RunOptions, MilestoneEpochsBecomeTheStepsThatEndThem) {
  TrainConfig config;
  config.lr_schedule = hpc_train::LrScheduleKind::kMultiStep;
  config.lr_milestone_epochs = "2,3";
  hpc_train::LrScheduleParams params = hpc_train::lr_schedule_options(config, 1000, 10);
  ASSERT_EQ(params.milestone_count, 2);
  EXPECT_EQ(params.milestones[0], 20);
  EXPECT_EQ(params.milestones[1], 30);
  config.grad_accum = 3;
  params = hpc_train::lr_schedule_options(config, 1000, 10);
  EXPECT_EQ(params.milestones[0], 6);   // 20 micro-steps: the 6th update ends at the 18th
  EXPECT_EQ(params.milestones[1], 10);  // 30 micro-steps: 10 whole updates
  config.grad_accum = 1;
  config.lr_milestone_epochs.clear();
  config.lr_milestones = "7,9";  // steps stay steps
  params = hpc_train::lr_schedule_options(config, 1000, 10);
  EXPECT_EQ(params.milestones[0], 7);
  EXPECT_EQ(params.milestones[1], 9);
}

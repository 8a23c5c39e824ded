// The run's decisions from the configuration (run_options.h): which steps cuDNN autotunes,
// when steps are captured as a CUDA graph, when the train split stays on the GPU.
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

}  // namespace


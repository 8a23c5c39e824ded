// The run's decisions from the configuration (run_options.h): which steps cuDNN autotunes,
// when steps are captured as a CUDA graph, when the train split stays on the GPU.
#include <gtest/gtest.h>

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

TEST(RunOptions, ResidentTrainSplit) {
  hpc_train::DatasetInfo small;
  small.channels = 3;
  small.height = small.width = 32;
  small.train_size = 50000;  // CIFAR-10: 154 MB
  hpc_train::DatasetInfo large = small;
  large.train_size = hpc_train::kAutoResidentBytes / (3 * 32 * 32);  // just over, with labels
  TrainConfig config;
  config.resident_data = hpc_train::Switch::kAuto;
  EXPECT_TRUE(hpc_train::keep_train_split_resident(config, small, /*cuda=*/true));
  EXPECT_FALSE(hpc_train::keep_train_split_resident(config, small, /*cuda=*/false));
  EXPECT_FALSE(hpc_train::keep_train_split_resident(config, large, /*cuda=*/true));
  config.data_store = hpc_train::DataStore::kMemory;  // Note [Store and resident data]
  EXPECT_FALSE(hpc_train::keep_train_split_resident(config, small, /*cuda=*/true));
  config.resident_data = hpc_train::Switch::kOn;
  EXPECT_TRUE(hpc_train::keep_train_split_resident(config, large, /*cuda=*/false));
  config.resident_data = hpc_train::Switch::kOff;
  EXPECT_FALSE(hpc_train::keep_train_split_resident(config, small, /*cuda=*/true));
}

}  // namespace

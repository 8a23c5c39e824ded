// A network of the model zoo through the training machinery: resnet18_imagenet (torchvision's
// resnet18: the 7x7 stride-2 stem and max-pool, 62 parameter tensors and 60 batch norm buffers)
// for a few ZeRO-2 steps on a tiny synthetic dataset, with buckets small enough that its
// 11.2 M parameters span many. (The smallest of the zoo's ResNets: the first step's bucket
// rebuild and every step's collectives cost in proportion to the parameters, and CI has two
// cores for three ranks.)
// Batch norm sees each rank's own micro-batch, so the run is not expected to match a
// single-rank one (as with DDP without SyncBatchNorm); the ranks must still agree exactly, and
// the steps must have moved the parameters.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>

#include "hpc_train/comm/comm.h"
#include "hpc_train/data/dataset_file.h"
#include "hpc_train/runtime/runtime.h"
#include "hpc_train/train/trainer.h"
#include "synthetic_dataset.h"
#include "test_device.h"

namespace {

using namespace hpc_train;

// torchvision.models.resnet18(num_classes=10): 11,181,642 parameters (model_zoo_reference.py
// prints the count; the ImageNet stem makes it independent of the image size).
constexpr int64_t kResNet18Parameters = 11181642;
constexpr int kSteps = 3;

TEST(ModelZooTraining, ResNet18ImageNetTrainsWithZero2AndEveryRankHoldsTheSameParameters) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string path;
  if (rank == 0) {
    path = test_support::make_test_directory("model_zoo_training") + "/data.h5";
    test_support::SyntheticShape shape;
    shape.channels = 3;
    shape.height = 16;  // stem 8x8, max-pool 4x4, layer4 1x1
    shape.width = 16;
    shape.train = 48;
    shape.test = 12;
    test_support::write_synthetic_dataset(path, shape, 11);
  }
  path = broadcast_string(MPI_COMM_WORLD, path, 0);
  MPI_Barrier(MPI_COMM_WORLD);
  {
    const DatasetFile file = DatasetFile::open(path);
    TrainConfig config;
    config.dataset_path = path;
    config.model = "resnet18_imagenet";
    config.micro_batch = 4;
    config.epochs = 1;
    config.max_steps = kSteps;
    config.log_every = 1000;
    config.seed = 5;
    config.zero_stage = 2;
    config.bucket_mb = 4.0;  // 45 MB of fp32 gradients: a dozen buckets
    config.first_bucket_mb = 1.0;
    const Placement placement = test_support::test_placement(config, MPI_COMM_WORLD);
    Trainer trainer(config, file, MPI_COMM_WORLD, TrainerOutput{"", false, false}, placement);
    const torch::Tensor initial = trainer.flat_parameters().clone();
    const TrainSummary summary = trainer.run();
    EXPECT_EQ(summary.steps, kSteps);
    EXPECT_EQ(summary.parameters, kResNet18Parameters);
    EXPECT_TRUE(std::isfinite(summary.final_train_loss));
    const torch::Tensor mine = trainer.flat_parameters();
    EXPECT_FALSE(torch::equal(mine, initial)) << "the steps left the parameters as they were";
    torch::Tensor root = mine.clone();
    Communicator(MPI_COMM_WORLD).broadcast(root, 0).wait();
    EXPECT_TRUE(torch::equal(root, mine)) << "rank " << rank << " holds other parameters";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0)
    test_support::remove_directory(std::filesystem::path(path).parent_path().string());
}

}  // namespace

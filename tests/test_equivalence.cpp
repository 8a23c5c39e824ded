// The central test of data parallelism: N ranks with micro-batch b end with the same parameters
// as 1 rank with batch N*b (fp32 on the CPU, relative difference <= 1e-5 after 20 steps).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "hpc_train/comm/comm.h"
#include "hpc_train/runtime/runtime.h"
#include "hpc_train/train/trainer.h"
#include "synthetic_dataset.h"
#include "test_device.h"

namespace {

using namespace hpc_train;

constexpr int kSteps = 20;
constexpr int kMicroBatch = 4;

// Rank 0 writes a synthetic dataset into a directory every rank sees; returns its path.
std::string shared_dataset(const test_support::SyntheticShape& shape) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string path;
  if (rank == 0) {
    path = test_support::make_test_directory("equivalence") + "/data.h5";
    test_support::write_synthetic_dataset(path, shape, 11);
  }
  path = broadcast_string(MPI_COMM_WORLD, path, 0);
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

TrainConfig small_run(const std::string& dataset, int micro_batch) {
  TrainConfig config;
  config.dataset_path = dataset;
  config.model = "simple_cnn";
  config.micro_batch = micro_batch;
  config.epochs = 3;
  config.max_steps = kSteps;
  config.log_every = 1000;
  config.seed = 3;
  return config;
}

TEST(DataParallel, NRanksMatchOneRankWithTheGlobalBatch) {
  Communicator world(MPI_COMM_WORLD);
  const int ranks = world.size();
  test_support::SyntheticShape shape;
  shape.train = 240;  // divisible by 2*4 and 3*4: no padding, 20 steps fit one epoch
  const std::string path = shared_dataset(shape);
  const DatasetFile file = DatasetFile::open(path);
  const TrainerOutput quiet{"", false, false};

  TrainConfig parallel_config = small_run(path, kMicroBatch);
  const Placement parallel_placement = test_support::test_placement(parallel_config, MPI_COMM_WORLD);
  Trainer parallel(parallel_config, file, MPI_COMM_WORLD, quiet, parallel_placement);
  const torch::Tensor initial = parallel.flat_parameters().clone();
  // simple_cnn on 1x8x8 with 10 classes: 155,530 parameters, not divisible by 3.
  ASSERT_NE(initial.numel() % 3, 0);
  const TrainSummary summary = parallel.run();
  ASSERT_EQ(summary.steps, kSteps);
  const torch::Tensor trained = parallel.flat_parameters();

  // Every rank holds the same parameters, bit for bit.
  torch::Tensor from_root = trained.clone();
  world.broadcast(from_root, 0).wait();
  EXPECT_TRUE(torch::equal(from_root, trained)) << "rank " << world.rank() << " diverged";

  if (world.rank() == 0) {
    TrainConfig single_config = small_run(path, ranks * kMicroBatch);
    const Placement single_placement = test_support::test_placement(single_config, MPI_COMM_SELF);
    Trainer single(single_config, file, MPI_COMM_SELF, quiet, single_placement);
    EXPECT_TRUE(torch::equal(single.flat_parameters(), initial)) << "same seed, same start";
    ASSERT_EQ(single.run().steps, kSteps);
    const torch::Tensor reference = single.flat_parameters();
    const double moved = ((reference - initial).norm() / initial.norm()).item<double>();
    const double difference = ((trained - reference).norm() / reference.norm()).item<double>();
    std::printf("%d ranks x %d vs 1 rank x %d after %d steps: parameters moved %.3e, relative "
                "difference %.3e\n", ranks, kMicroBatch, ranks * kMicroBatch, kSteps, moved,
                difference);
    EXPECT_GT(moved, 1e-3) << "training must change the parameters for the test to mean anything";
    EXPECT_LE(difference, test_support::parameter_tolerance());
    test_support::remove_directory(std::filesystem::path(path).parent_path().string());
  }
}

}  // namespace

// The read-once sample store (sample_store.h): who sends what in an exchange (a pure function,
// routed by hand here), and at 1, 2 and 3 ranks that the store's micro-batches are, byte for
// byte, what the file gives for the same epoch plan (a file and its shards; a resumed epoch; a
// partial last micro-batch), and that a share over its limit, or plans of unequal length, stop
// every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "hpc_train/comm/comm.h"
#include "hpc_train/data/dataset_shards.h"
#include "hpc_train/data/sample_store.h"
#include "hpc_train/error.h"
#include "mpi_world.h"
#include "synthetic_dataset.h"

using namespace hpc_train;
using ::test_support::world_rank;
using ::test_support::world_size;
namespace synthetic = hpc_train::test_support;

TEST(PlanBatchExchange, NamesWhatEachOwnerSends) {
  const std::vector<SampleRange> owned = split_evenly(10, 3);  // [0, 4) [4, 7) [7, 10)
  const std::vector<std::vector<int64_t>> batches = {{9, 0, 5}, {4, 4, 1}, {2}};
  const BatchExchange plan = plan_batch_exchange(owned, batches, 1);
  EXPECT_EQ(plan.send_counts, (std::vector<int64_t>{1, 2, 0}));
  EXPECT_EQ(plan.send_offsets, (std::vector<int64_t>{1, 0, 0}));  // 5 to rank 0, 4 and 4 to 1
  EXPECT_EQ(plan.recv_counts, (std::vector<int64_t>{1, 2, 0}));   // 1 from rank 0, 4 4 from 1
  EXPECT_EQ(plan.recv_slots, (std::vector<int64_t>{2, 0, 1}));
}

// Every rank's plan, routed the way MPI_Alltoallv moves the bytes, rebuilds every batch.
TEST(PlanBatchExchange, RoutesEverySampleToItsPlace) {
  const std::vector<SampleRange> owned = split_evenly(11, 4);
  const std::vector<std::vector<int64_t>> batches = {
      {10, 0, 3, 7, 7}, {1, 2, 3}, {}, {8, 9, 4, 5, 6, 0}};
  std::vector<BatchExchange> plans;
  for (int r = 0; r < 4; ++r) plans.push_back(plan_batch_exchange(owned, batches, r));
  for (int to = 0; to < 4; ++to) {
    std::vector<int64_t> received;  // dataset indices, as the owners send them, rank 0's first
    for (int from = 0; from < 4; ++from) {
      const BatchExchange& sender = plans[from];
      EXPECT_EQ(sender.send_counts[to], plans[to].recv_counts[from]) << from << " -> " << to;
      int64_t first = 0;
      for (int r = 0; r < to; ++r) first += sender.send_counts[r];
      for (int64_t k = first; k < first + sender.send_counts[to]; ++k)
        received.push_back(owned[from].begin + sender.send_offsets[k]);
    }
    ASSERT_EQ(received.size(), plans[to].recv_slots.size());
    std::vector<int64_t> rebuilt(batches[to].size(), -1);
    for (size_t k = 0; k < received.size(); ++k) rebuilt[plans[to].recv_slots[k]] = received[k];
    EXPECT_EQ(rebuilt, batches[to]) << "rank " << to;
  }
}

class SampleStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = synthetic::make_test_directory("sample_store");
    // 37 train samples of 2x3x5, 5 test samples, 4 classes.
    synthetic::write_synthetic_dataset(dir_ + "/whole.h5", {37, 5, 2, 3, 5, 4}, 7);
    write_dataset_shards(dir_ + "/whole.h5", 3, dir_ + "/three");
  }
  void TearDown() override { synthetic::remove_directory(dir_); }

  std::string dir_;
};

TEST_F(SampleStoreTest, ExchangesWhatTheFileReads) {
  Communicator comm(MPI_COMM_WORLD);
  constexpr int64_t kBatch = 4;  // 13, 19 or 37 samples a rank: the last micro-batch is partial
  for (const std::string& spec : {dir_ + "/whole.h5", shard_index_path(dir_ + "/three")}) {
    const DatasetFile file = DatasetFile::open(spec);
    SampleStore store(file, comm, int64_t{1} << 30);
    const int64_t sample_bytes = file.info().sample_bytes();
    EXPECT_EQ(store.read_bytes(), store.owned().count * sample_bytes);
    for (const int64_t first_position : {int64_t{0}, int64_t{11}}) {
      const std::vector<int64_t> plan = store.start_epoch(5, 1, EpochTail::kPad, first_position);
      EXPECT_EQ(plan, rank_epoch_indices(5, 1, 37, world_size(), world_rank(), EpochTail::kPad,
                                         true, first_position));
      for (int64_t b = 0; b * kBatch < static_cast<int64_t>(plan.size()); ++b) {
        const std::vector<int64_t> indices(
            plan.begin() + b * kBatch,
            plan.begin() + std::min<int64_t>((b + 1) * kBatch, plan.size()));
        std::vector<uint8_t> images(indices.size() * sample_bytes);
        std::vector<int64_t> labels(indices.size());
        file.read_samples(Split::kTrain, indices, images.data(), labels.data());
        HostBatch batch;
        store.exchange(b, kBatch, batch);
        ASSERT_EQ(batch.size, static_cast<int64_t>(indices.size())) << spec << " batch " << b;
        EXPECT_EQ(batch.images, images) << spec << " batch " << b;
        EXPECT_EQ(batch.labels, labels) << spec << " batch " << b;
      }
    }
  }
}

TEST_F(SampleStoreTest, AShareOverItsLimitStopsEveryRank) {
  Communicator comm(MPI_COMM_WORLD);
  const DatasetFile file = DatasetFile::open(dir_ + "/whole.h5");
  // Rank 0's share needs (2*3*5 + 8) bytes a sample; one byte is too little.
  const int64_t limit_bytes = world_rank() == 0 ? 1 : int64_t{1} << 30;
  try {
    SampleStore store(file, comm, limit_bytes);
    FAIL() << "the store was made over rank 0's limit";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--data-store-limit-mb"), std::string::npos) << what;
    if (world_rank() == 0) {
      EXPECT_NE(what.find("rank 0's share of the train split"), std::string::npos) << what;
      EXPECT_NE(what.find("more than its limit of 1 B"), std::string::npos) << what;
    }
  }
}

// Plans of unequal length (kUneven, evaluation's tail) would leave a rank out of an exchange:
// every rank refuses them alike instead of hanging.
TEST_F(SampleStoreTest, RefusesPlansOfUnequalLength) {
  Communicator comm(MPI_COMM_WORLD);
  const DatasetFile file = DatasetFile::open(dir_ + "/whole.h5");
  SampleStore store(file, comm, int64_t{1} << 30);
  if (37 % world_size() == 0) {
    EXPECT_EQ(store.start_epoch(5, 0, EpochTail::kUneven, 0).size(), 37u);
  } else {
    EXPECT_THROW(store.start_epoch(5, 0, EpochTail::kUneven, 0), Error);
  }
}

// The epoch plan: a pure function of (seed, epoch, dataset size, world size, rank) with
// DistributedSampler semantics. Closed-form checks at world sizes 1..5 and awkward sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "hpc_train/data/epoch_plan.h"
#include "hpc_train/error.h"

using namespace hpc_train;

namespace {

const EpochTail kTails[] = {EpochTail::kPad, EpochTail::kDrop, EpochTail::kUneven};
const int64_t kSizes[] = {0, 1, 2, 3, 7, 10, 11, 64, 101};

bool is_permutation_of_range(std::vector<int64_t> values, int64_t n) {
  std::sort(values.begin(), values.end());
  std::vector<int64_t> expected(n);
  std::iota(expected.begin(), expected.end(), int64_t{0});
  return values == expected;
}

}  // namespace

TEST(EpochPermutation, IsAPermutation) {
  for (int64_t n : kSizes)
    EXPECT_TRUE(is_permutation_of_range(epoch_permutation(3, 5, n), n)) << "n = " << n;
}

TEST(EpochPermutation, PureFunctionOfSeedAndEpoch) {
  EXPECT_EQ(epoch_permutation(7, 2, 1000), epoch_permutation(7, 2, 1000));
  EXPECT_NE(epoch_permutation(7, 2, 1000), epoch_permutation(7, 3, 1000));
  EXPECT_NE(epoch_permutation(7, 2, 1000), epoch_permutation(8, 2, 1000));
}

// Fixed values: the generator is ours (SplitMix64 + xoshiro256** + Lemire), so these must come
// out the same with every compiler and standard library. A change here changes every run's
// sample order and breaks exact resume of old checkpoints: do it only on purpose.
TEST(EpochPermutation, GoldenValues) {
  EXPECT_EQ(epoch_permutation(42, 0, 10), (std::vector<int64_t>{5, 6, 9, 3, 0, 8, 7, 4, 2, 1}));
  EXPECT_EQ(epoch_permutation(42, 1, 10), (std::vector<int64_t>{9, 7, 6, 4, 2, 0, 8, 5, 1, 3}));
  const std::vector<int64_t> large = epoch_permutation(0xDEADBEEF, 7, 1000);
  EXPECT_EQ(large[0], 746);
  EXPECT_EQ(large[500], 604);
  EXPECT_EQ(large[999], 247);
}

// All 6 orders of 3 elements come out about equally often (unbiased draws): 6,000 epochs, each
// order expected 1,000 times; 5 standard deviations is about +-150.
TEST(EpochPermutation, Uniform) {
  std::map<std::vector<int64_t>, int> counts;
  for (int64_t epoch = 0; epoch < 6000; ++epoch) ++counts[epoch_permutation(1, epoch, 3)];
  ASSERT_EQ(counts.size(), 6u);
  for (const auto& [order, count] : counts) {
    EXPECT_GT(count, 850);
    EXPECT_LT(count, 1150);
  }
}

TEST(EpochPlan, CountsPerRank) {
  // 10 samples, 3 ranks: pad to 12 (4 each), drop to 9 (3 each), uneven 4, 3, 3.
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(samples_for_rank(10, 3, r, EpochTail::kPad), 4);
    EXPECT_EQ(samples_for_rank(10, 3, r, EpochTail::kDrop), 3);
  }
  EXPECT_EQ(samples_for_rank(10, 3, 0, EpochTail::kUneven), 4);
  EXPECT_EQ(samples_for_rank(10, 3, 1, EpochTail::kUneven), 3);
  EXPECT_EQ(samples_for_rank(10, 3, 2, EpochTail::kUneven), 3);
  // Fewer samples than ranks.
  EXPECT_EQ(samples_for_rank(2, 3, 2, EpochTail::kPad), 1);
  EXPECT_EQ(samples_for_rank(2, 3, 2, EpochTail::kDrop), 0);
  EXPECT_EQ(samples_for_rank(2, 3, 1, EpochTail::kUneven), 1);
  EXPECT_EQ(samples_for_rank(2, 3, 2, EpochTail::kUneven), 0);
  EXPECT_EQ(samples_for_rank(0, 3, 0, EpochTail::kPad), 0);
  EXPECT_THROW(samples_for_rank(10, 3, 3, EpochTail::kPad), Error);
  EXPECT_THROW(samples_for_rank(10, 0, 0, EpochTail::kPad), Error);
}

// Every rank's list, reassembled rank-strided, is the permutation (padded by its head, or cut),
// whatever the world size: the permutation does not depend on it.
TEST(EpochPlan, RanksTogetherAreThePaddedOrCutPermutation) {
  for (int world = 1; world <= 5; ++world) {
    for (int64_t n : kSizes) {
      for (EpochTail tail : kTails) {
        for (bool shuffle : {true, false}) {
          SCOPED_TRACE("world " + std::to_string(world) + ", n " + std::to_string(n) +
                       ", tail " + std::to_string(static_cast<int>(tail)) +
                       (shuffle ? ", shuffled" : ", in order"));
          std::vector<int64_t> order(n);
          std::iota(order.begin(), order.end(), int64_t{0});
          if (shuffle) order = epoch_permutation(11, 4, n);
          std::vector<std::vector<int64_t>> ranks;
          int64_t total = 0;
          for (int r = 0; r < world; ++r) {
            ranks.push_back(rank_epoch_indices(11, 4, n, world, r, tail, shuffle));
            EXPECT_EQ(static_cast<int64_t>(ranks.back().size()),
                      samples_for_rank(n, world, r, tail));
            total += static_cast<int64_t>(ranks.back().size());
          }
          const int64_t expected_total = n == 0                      ? 0
                                         : tail == EpochTail::kPad  ? (n + world - 1) / world * world
                                         : tail == EpochTail::kDrop ? n / world * world
                                                                    : n;
          ASSERT_EQ(total, expected_total);
          for (int64_t position = 0; position < total; ++position)
            EXPECT_EQ(ranks[position % world][position / world], order[position % n])
                << "position " << position;
          // Disjoint, and all of the dataset unless documented otherwise (pad repeats, drop cuts).
          std::vector<int64_t> all;
          for (const auto& mine : ranks) all.insert(all.end(), mine.begin(), mine.end());
          const std::set<int64_t> unique(all.begin(), all.end());
          if (tail == EpochTail::kPad) {
            EXPECT_EQ(static_cast<int64_t>(unique.size()), n);
          } else {
            EXPECT_EQ(unique.size(), all.size());
            if (tail == EpochTail::kUneven) {
              EXPECT_TRUE(is_permutation_of_range(all, n));
            }
          }
        }
      }
    }
  }
}

// torch's padding: indices += indices[:padding], repeating whole copies if padding > n.
TEST(EpochPlan, PaddingRepeatsTheHead) {
  const std::vector<int64_t> p = epoch_permutation(5, 0, 7);
  // 7 samples on 3 ranks: 9 positions, p + p[0:2].
  EXPECT_EQ(rank_epoch_indices(5, 0, 7, 3, 0, EpochTail::kPad, true),
            (std::vector<int64_t>{p[0], p[3], p[6]}));
  EXPECT_EQ(rank_epoch_indices(5, 0, 7, 3, 1, EpochTail::kPad, true),
            (std::vector<int64_t>{p[1], p[4], p[0]}));
  EXPECT_EQ(rank_epoch_indices(5, 0, 7, 3, 2, EpochTail::kPad, true),
            (std::vector<int64_t>{p[2], p[5], p[1]}));
  // 2 samples on 5 ranks: [q0, q1, q0, q1, q0].
  const std::vector<int64_t> q = epoch_permutation(5, 0, 2);
  for (int r = 0; r < 5; ++r)
    EXPECT_EQ(rank_epoch_indices(5, 0, 2, 5, r, EpochTail::kPad, true),
              (std::vector<int64_t>{q[r % 2]}));
}

TEST(EpochPlan, PureFunction) {
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(rank_epoch_indices(9, 1, 100, 3, r, EpochTail::kPad, true),
              rank_epoch_indices(9, 1, 100, 3, r, EpochTail::kPad, true));
    EXPECT_NE(rank_epoch_indices(9, 1, 100, 3, r, EpochTail::kPad, true),
              rank_epoch_indices(9, 2, 100, 3, r, EpochTail::kPad, true));
  }
}

// N ranks with micro-batch b see, step by step, the global batch of 1 rank with batch N*b.
TEST(EpochPlan, GlobalBatchEqualsSingleRankBatch) {
  const int64_t n = 101, micro_batch = 4;
  for (int world : {2, 3}) {
    const std::vector<int64_t> single =
        rank_epoch_indices(3, 2, n, 1, 0, EpochTail::kDrop, true);
    std::vector<std::vector<int64_t>> ranks;
    for (int r = 0; r < world; ++r)
      ranks.push_back(rank_epoch_indices(3, 2, n, world, r, EpochTail::kDrop, true));
    const int64_t steps = batches_per_epoch(static_cast<int64_t>(ranks[0].size()), micro_batch);
    for (int64_t step = 0; step < steps; ++step) {
      std::multiset<int64_t> global, reference;
      for (const auto& mine : ranks)
        for (int64_t k = step * micro_batch;
             k < std::min<int64_t>((step + 1) * micro_batch, mine.size()); ++k)
          global.insert(mine[k]);
      const int64_t begin = step * micro_batch * world;
      for (int64_t k = begin; k < begin + static_cast<int64_t>(global.size()); ++k)
        reference.insert(single[k]);
      EXPECT_EQ(global, reference) << "world " << world << ", step " << step;
    }
  }
}

TEST(EpochPlan, BatchesPerEpoch) {
  EXPECT_EQ(batches_per_epoch(10, 3), 4);
  EXPECT_EQ(batches_per_epoch(9, 3), 3);
  EXPECT_EQ(batches_per_epoch(0, 3), 0);
  EXPECT_EQ(batches_per_epoch(1, 64), 1);
  EXPECT_THROW(batches_per_epoch(10, 0), Error);
}

// Note [Resume position]: resuming at the position the ranks had reached continues exactly the
// plan's tail at the same world size, and covers the permutation's remaining positions at any other.
TEST(EpochPlan, ResumeAtTheSameWorldSizeIsTheTailOfThePlan) {
  for (EpochTail tail : {EpochTail::kPad, EpochTail::kDrop})
    for (int world : {1, 2, 3, 4})
      for (int64_t n : {int64_t{7}, int64_t{64}, int64_t{101}})
        for (int64_t consumed_per_rank : {int64_t{0}, int64_t{1}, int64_t{5}}) {
          for (int rank = 0; rank < world; ++rank) {
            const std::vector<int64_t> whole = rank_epoch_indices(9, 2, n, world, rank, tail, true);
            if (consumed_per_rank > static_cast<int64_t>(whole.size())) continue;
            const std::vector<int64_t> resumed = rank_epoch_indices(
                9, 2, n, world, rank, tail, true, consumed_per_rank * world);
            EXPECT_EQ(resumed, std::vector<int64_t>(whole.begin() + consumed_per_rank, whole.end()))
                << "n " << n << ", world " << world << ", rank " << rank << ", consumed "
                << consumed_per_rank;
          }
        }
}

TEST(EpochPlan, ResumeAtAnotherWorldSizeContinuesTheSameGlobalBatches) {
  // 4 ranks x 16 consumed 5 micro-steps (320 positions); 2 ranks x 16 x 2 micro-steps and
  // 1 rank x 64 then take, optimizer step by optimizer step, the positions the 4 ranks would have.
  const int64_t n = 1000;
  const int64_t consumed = 5 * 16 * 4;
  auto global_steps = [&](int world, int64_t micro_batch, int64_t accum, int64_t first_position) {
    std::vector<std::vector<int64_t>> per_rank;
    for (int rank = 0; rank < world; ++rank)
      per_rank.push_back(rank_epoch_indices(9, 0, n, world, rank, EpochTail::kDrop, true,
                                            first_position));
    std::vector<std::multiset<int64_t>> steps;
    const int64_t per_step = micro_batch * accum;
    for (size_t begin = 0; begin + per_step <= per_rank[0].size(); begin += per_step) {
      std::multiset<int64_t> step;
      for (const auto& mine : per_rank) step.insert(mine.begin() + begin, mine.begin() + begin + per_step);
      steps.push_back(std::move(step));
    }
    return steps;
  };
  std::vector<std::multiset<int64_t>> straight = global_steps(4, 16, 1, 0);
  straight.erase(straight.begin(), straight.begin() + 5);
  EXPECT_EQ(global_steps(2, 16, 2, consumed), straight);
  EXPECT_EQ(global_steps(1, 64, 1, consumed), straight);
  // And together with the consumed head, every sample once.
  std::vector<int64_t> seen = epoch_permutation(9, 0, n);
  seen.resize(consumed);
  for (int rank = 0; rank < 3; ++rank)
    for (int64_t index : rank_epoch_indices(9, 0, n, 3, rank, EpochTail::kPad, true, consumed))
      seen.push_back(index);
  std::multiset<int64_t> counts(seen.begin(), seen.end());
  for (int64_t i = 0; i < n; ++i) EXPECT_GE(counts.count(i), 1u) << i;
  EXPECT_EQ(seen.size(), static_cast<size_t>(consumed + (n - consumed + 2) / 3 * 3));
  EXPECT_TRUE(rank_epoch_indices(9, 0, n, 3, 1, EpochTail::kPad, true, n).empty());
  EXPECT_THROW(rank_epoch_indices(9, 0, n, 3, 1, EpochTail::kPad, true, -1), Error);
}

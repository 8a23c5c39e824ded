// Bucket assignment (a free function) and the layout it defines: caps, order, a parameter larger
// than a bucket, dtype groups, padding and partitions at world sizes that do not divide.
#include <gtest/gtest.h>

#include <algorithm>

#include "hpc_train/comm/buckets.h"
#include "hpc_train/error.h"

using namespace hpc_train;

namespace {

std::vector<BucketParameter> fp32(const std::vector<int64_t>& numels) {
  std::vector<BucketParameter> params;
  for (size_t i = 0; i < numels.size(); ++i) params.push_back({static_cast<int>(i), numels[i], 4, 0});
  return params;
}

std::vector<std::vector<int>> members(const std::vector<Bucket>& buckets) {
  std::vector<std::vector<int>> result;
  for (const Bucket& b : buckets) result.push_back(b.parameters);
  return result;
}

}  // namespace

TEST(AssignBuckets, FillsUpToTheCapInTheGivenOrder) {
  // 10 parameters of 25 floats (100 bytes); cap 300 bytes -> 3 per bucket, first bucket 100.
  const auto buckets = assign_buckets(fp32(std::vector<int64_t>(10, 25)), 100, 300);
  EXPECT_EQ(members(buckets),
            (std::vector<std::vector<int>>{{0}, {1, 2, 3}, {4, 5, 6}, {7, 8, 9}}));
  for (const Bucket& b : buckets) EXPECT_LE(b.bytes, 300);
}

TEST(AssignBuckets, KeepsTheReadyOrder) {
  auto params = fp32({10, 10, 10, 10});
  std::reverse(params.begin(), params.end());
  const auto buckets = assign_buckets(params, 80, 80);
  EXPECT_EQ(members(buckets), (std::vector<std::vector<int>>{{3, 2}, {1, 0}}));
}

TEST(AssignBuckets, ParameterLargerThanABucketGetsItsOwn) {
  const auto buckets = assign_buckets(fp32({10, 1000, 10, 10}), 200, 200);
  EXPECT_EQ(members(buckets), (std::vector<std::vector<int>>{{0}, {1}, {2, 3}}));
  EXPECT_EQ(buckets[1].bytes, 4000);
}

TEST(AssignBuckets, SeparatesDtypes) {
  // Alternating fp32 (dtype 0) and fp16 (dtype 1) parameters never share a bucket.
  std::vector<BucketParameter> params;
  for (int i = 0; i < 6; ++i) params.push_back({i, 10, i % 2 ? 2 : 4, i % 2});
  const auto buckets = assign_buckets(params, 80, 80);
  for (const Bucket& b : buckets)
    for (int p : b.parameters) EXPECT_EQ(p % 2, b.dtype);
  // fp32: 40 bytes each, cap 80 -> {0,2}, {4}; fp16: 20 bytes each -> {1,3,5} stays open.
  EXPECT_EQ(members(buckets), (std::vector<std::vector<int>>{{0, 2}, {4}, {1, 3, 5}}));
}

TEST(AssignBuckets, RejectsZeroCaps) { EXPECT_THROW(assign_buckets(fp32({1}), 0, 10), Error); }

TEST(BucketLayout, PadsEachBucketToTheWorldSize) {
  const std::vector<int64_t> numels = {7, 5, 4};  // 16 elements, not divisible by 3
  const auto buckets = assign_buckets(fp32(numels), 28, 40);  // {0}, {1, 2}
  const BucketLayout layout = make_bucket_layout(buckets, numels, 3);
  ASSERT_EQ(layout.spans.size(), 2u);
  EXPECT_EQ(layout.spans[0].numel, 7);
  // Padded to a multiple of 3 x 16 (kSlotAlignmentElements): 48, so each rank's slice is 16.
  EXPECT_EQ(layout.spans[0].padded_numel, 48);
  EXPECT_EQ(layout.spans[0].slice_numel, 16);
  // The second bucket's second parameter starts at the slot boundary after its first: 5 elements
  // at 48, 4 at 64, so 20 elements padded to 48.
  EXPECT_EQ(layout.spans[1].offset, 48);
  EXPECT_EQ(layout.slots[1].offset, 48);
  EXPECT_EQ(layout.slots[2].offset, 64);
  EXPECT_EQ(layout.spans[1].numel, 20);
  EXPECT_EQ(layout.spans[1].padded_numel, 48);
  EXPECT_EQ(layout.total_numel, 96);
  EXPECT_EQ(layout.partition_numel, 32);  // 16 + 16: 1/3 of the padded total
  EXPECT_EQ(layout.spans[1].partition_offset, 16);
  for (int world = 1; world <= 5; ++world) {
    const BucketLayout l = make_bucket_layout(buckets, numels, world);
    EXPECT_EQ(l.partition_numel * world, l.total_numel);
    for (const BucketLayout::Span& span : l.spans)
      EXPECT_LT(span.padded_numel - span.numel, world * kSlotAlignmentElements);
    // In a world of one the partition is the flat buffer: each bucket's slice sits where it does.
    if (world == 1)
      for (const BucketLayout::Span& span : l.spans) EXPECT_EQ(span.partition_offset, span.offset);
  }
}

TEST(BucketLayout, EveryParameterStartsOnASlotBoundary) {
  // An fc bias of 10 elements first (the ready order puts the head first), then odd sizes.
  const std::vector<int64_t> numels = {10, 5120, 3, 64, 1, 1728};
  for (int world = 1; world <= 3; ++world) {
    const BucketLayout layout =
        make_bucket_layout(assign_buckets(fp32(numels), 100, 4000), numels, world);
    for (const BucketLayout::Slot& slot : layout.slots)
      EXPECT_EQ(slot.offset % kSlotAlignmentElements, 0) << "world " << world;
    for (const BucketLayout::Span& span : layout.spans) {
      EXPECT_EQ(span.offset % kSlotAlignmentElements, 0) << "world " << world;
      EXPECT_EQ(span.slice_numel % kSlotAlignmentElements, 0) << "world " << world;
    }
  }
}

TEST(BucketLayout, EveryParameterExactlyOnce) {
  std::vector<Bucket> twice(2);
  twice[0].parameters = {0};
  twice[1].parameters = {0};
  EXPECT_THROW(make_bucket_layout(twice, {4, 4}, 2), Error);
}

// A rank's partition is its slice of each bucket: the layout above ({0}, {1, 2}; buckets of 48
// padded elements at 0 and 48, slices of 16) at 3 ranks.
TEST(Partition, EachRanksSliceOfEveryBucket) {
  const std::vector<int64_t> numels = {7, 5, 4};
  const BucketLayout layout = make_bucket_layout(assign_buckets(fp32(numels), 28, 40), numels, 3);
  for (int rank = 0; rank < 3; ++rank) {
    const Partition partition = partition_of(layout, rank);
    ASSERT_EQ(partition.slices.size(), 2u);
    EXPECT_EQ(partition.slices[0].flat_offset, 16 * rank);
    EXPECT_EQ(partition.slices[1].flat_offset, 48 + 16 * rank);
    EXPECT_EQ(partition.slices[0].partition_offset, 0);
    EXPECT_EQ(partition.slices[1].partition_offset, 16);
    EXPECT_EQ(partition.slices[0].numel, 16);
    EXPECT_EQ(partition.numel, 32);
    EXPECT_EQ(partition.flat_numel, 96);
  }
  // In a world of one the partition is the flat buffer, slice for bucket.
  const Partition whole = partition_of(make_bucket_layout(layout.buckets, numels, 1), 0);
  for (const Partition::Slice& slice : whole.slices)
    EXPECT_EQ(slice.flat_offset, slice.partition_offset);
  EXPECT_EQ(whole.numel, whole.flat_numel);
  EXPECT_THROW(partition_of(layout, 3), Error);
}

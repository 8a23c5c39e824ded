#include "hpc_train/comm/buckets.h"

#include <algorithm>
#include <map>
#include <string>

#include "hpc_train/error.h"

namespace hpc_train {

std::vector<Bucket> assign_buckets(const std::vector<BucketParameter>& ready_order,
                                   int64_t first_bucket_bytes, int64_t bucket_bytes) {
  if (first_bucket_bytes <= 0 || bucket_bytes <= 0)
    throw Error("assign_buckets: bucket caps must be positive");
  std::vector<Bucket> closed;
  std::map<int, Bucket> open;       // per dtype
  std::map<int, int> closed_count;  // per dtype: the first bucket has the smaller cap
  auto cap = [&](int dtype) {
    return closed_count[dtype] == 0 ? first_bucket_bytes : bucket_bytes;
  };
  auto close = [&](int dtype) {
    auto it = open.find(dtype);
    if (it == open.end() || it->second.parameters.empty()) return;
    closed.push_back(std::move(it->second));
    open.erase(it);
    ++closed_count[dtype];
  };
  for (const BucketParameter& p : ready_order) {
    const int64_t bytes = p.numel * p.element_bytes;
    Bucket& bucket = open[p.dtype];
    // Close before a parameter that would push a non-empty bucket over its cap, so that only a
    // parameter larger than the cap makes a bucket exceed it (alone).
    if (!bucket.parameters.empty() && bucket.bytes + bytes > cap(p.dtype)) {
      close(p.dtype);
    }
    Bucket& target = open[p.dtype];
    target.dtype = p.dtype;
    target.parameters.push_back(p.index);
    target.numel += p.numel;
    target.bytes += bytes;
    if (target.bytes >= cap(p.dtype)) close(p.dtype);
  }
  // Whatever remains open closes at the end, in the order of its dtype's first appearance.
  std::vector<int> remaining;
  for (const BucketParameter& p : ready_order)
    if (open.count(p.dtype) && !open[p.dtype].parameters.empty() &&
        std::find(remaining.begin(), remaining.end(), p.dtype) == remaining.end())
      remaining.push_back(p.dtype);
  for (int dtype : remaining) close(dtype);
  return closed;
}

namespace {
int64_t align_up(int64_t offset) {
  return (offset + kSlotAlignmentElements - 1) / kSlotAlignmentElements * kSlotAlignmentElements;
}
}  // namespace

BucketLayout make_bucket_layout(std::vector<Bucket> buckets,
                                const std::vector<int64_t>& parameter_numels, int world_size) {
  if (world_size < 1) throw Error("make_bucket_layout: world size must be at least 1");
  BucketLayout layout;
  layout.world_size = world_size;
  layout.slots.assign(parameter_numels.size(), {});
  std::vector<bool> placed(parameter_numels.size(), false);
  int64_t offset = 0;
  int64_t partition_offset = 0;
  for (const Bucket& bucket : buckets) {
    BucketLayout::Span span;
    span.offset = offset;
    int64_t end = span.offset;  // past the bucket's last parameter so far
    for (int index : bucket.parameters) {
      if (index < 0 || index >= static_cast<int>(parameter_numels.size()) || placed[index])
        throw Error("make_bucket_layout: parameter " + std::to_string(index) +
                    " is out of range or in two buckets");
      placed[index] = true;
      layout.slots[index] = {align_up(end), parameter_numels[index]};
      end = layout.slots[index].offset + parameter_numels[index];
    }
    span.numel = end - span.offset;
    // A multiple of W slot boundaries: the next bucket and every rank's slice start on one too.
    const int64_t quantum = world_size * kSlotAlignmentElements;
    span.padded_numel = (span.numel + quantum - 1) / quantum * quantum;
    span.slice_numel = span.padded_numel / world_size;
    span.partition_offset = partition_offset;
    offset = span.offset + span.padded_numel;
    partition_offset += span.slice_numel;
    layout.spans.push_back(span);
  }
  for (size_t i = 0; i < placed.size(); ++i)
    if (!placed[i]) throw Error("make_bucket_layout: parameter " + std::to_string(i) + " is in no bucket");
  layout.buckets = std::move(buckets);
  layout.total_numel = offset;
  layout.partition_numel = partition_offset;
  return layout;
}

Partition partition_of(const BucketLayout& layout, int rank) {
  if (rank < 0 || rank >= layout.world_size)
    throw Error("partition_of: rank " + std::to_string(rank) + " of a world of " +
                std::to_string(layout.world_size));
  Partition partition;
  for (const BucketLayout::Span& span : layout.spans)
    if (span.slice_numel > 0)
      partition.slices.push_back(
          {span.offset + rank * span.slice_numel, span.partition_offset, span.slice_numel});
  partition.numel = layout.partition_numel;
  partition.flat_numel = layout.total_numel;
  return partition;
}

}  // namespace hpc_train

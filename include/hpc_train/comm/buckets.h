// Gradient buckets and the flat layout they define.
//
// A bucket is a run of parameters whose gradients are reduced by one collective. Buckets are
// filled in the order in which gradients are expected to become ready (reverse parameter order
// at first, then the order observed in the first step), one dtype per bucket.
//
// Note [Bucket layout]
// The flat parameter and gradient buffers (flat_parameters.h) are laid out bucket after bucket,
// each bucket's parameters in order and the bucket padded with zeros to a multiple of
// W x kSlotAlignmentElements, W the world size. A bucket of padded size P is split into W equal
// slices; rank r's ZeRO partition is its slice of every bucket, concatenated. So a reduce-scatter
// or an all-gather of one bucket is one equal-count collective (MPI_Ireduce_scatter_block,
// ncclReduceScatter), any parameter count works at any world size, and in a world of one the
// partition is the flat buffer itself (the reducer's in-place reduce-scatter relies on that).
//
// Every parameter, every bucket and every rank's slice starts on a boundary of
// kSlotAlignmentElements elements (the gaps between parameters are zeros, reduced and updated like
// the padding, and stay zero): LibTorch allocates each tensor of its own 512-byte aligned, and
// kernels that read parameters with vector loads rely on that. cuDNN's NHWC batch norm ended the
// step with "misaligned address" on a scale vector that a 10-element fc bias had pushed 8 bytes
// off a 16-byte boundary (bench/results-notes.md, Note [Bucket layout]). Padding and gaps cost
// less than (W + parameters) x kSlotAlignmentElements elements.
#pragma once

#include <cstdint>
#include <vector>

namespace hpc_train {

// Defaults, as PyTorch DDP: a small first bucket starts communication early in backward.
inline constexpr double kDefaultBucketMiB = 25.0;
inline constexpr double kDefaultFirstBucketMiB = 1.0;

// 64 bytes in fp32, 32 in fp16/bf16: at least the 16 that vector loads need.
inline constexpr int64_t kSlotAlignmentElements = 16;

struct BucketParameter {
  int index = 0;          // position in the model's parameter list
  int64_t numel = 0;
  int element_bytes = 4;
  int dtype = 0;          // any id: parameters of different dtypes never share a bucket
};

struct Bucket {
  int dtype = 0;
  std::vector<int> parameters;  // model parameter indices, in bucket order
  int64_t numel = 0;            // elements, before padding
  int64_t bytes = 0;
};

// Fills buckets from `ready_order` (the parameters in the order their gradients are expected to
// become ready). A bucket holds at most `bucket_bytes` (the first bucket of each dtype at most
// `first_bucket_bytes`), except that a parameter larger than the cap gets a bucket of its own.
// Buckets come out in the order they close, so the first is the first to become ready.
std::vector<Bucket> assign_buckets(const std::vector<BucketParameter>& ready_order,
                                   int64_t first_bucket_bytes, int64_t bucket_bytes);

// Where everything lives in the flat buffers for a world of `world_size` ranks.
struct BucketLayout {
  struct Slot {
    int64_t offset = 0;  // in the flat buffers
    int64_t numel = 0;
  };
  struct Span {
    int64_t offset = 0;           // first element of the bucket in the flat buffers
    int64_t numel = 0;            // its parameters' elements, alignment gaps between them included
    int64_t padded_numel = 0;     // a multiple of world_size x kSlotAlignmentElements
    int64_t slice_numel = 0;      // padded_numel / world_size: one rank's share
    int64_t partition_offset = 0; // where this bucket's slice sits in a rank's partition
  };
  int world_size = 1;
  std::vector<Bucket> buckets;
  std::vector<Span> spans;        // one per bucket
  std::vector<Slot> slots;        // one per model parameter, by model index
  int64_t total_numel = 0;        // flat buffer size, padding included
  int64_t partition_numel = 0;    // sum of slice_numel: one rank's partition
};

// Lays out `buckets` (covering each of `parameter_numels` exactly once) per Note [Bucket layout].
BucketLayout make_bucket_layout(std::vector<Bucket> buckets,
                                const std::vector<int64_t>& parameter_numels, int world_size);

// One rank's ZeRO partition of the flat buffers: its slice of every bucket (Note [Bucket
// layout]), which is all the optimizer sees of a layout. Slices are in bucket order, each
// `numel` elements at `flat_offset` in the flat buffers and at `partition_offset` in a partition
// tensor (which holds them back to back, `numel` elements in all); empty slices are left out.
struct Partition {
  struct Slice {
    int64_t flat_offset = 0;
    int64_t partition_offset = 0;
    int64_t numel = 0;
  };
  std::vector<Slice> slices;
  int64_t numel = 0;       // the partition's elements
  int64_t flat_numel = 0;  // the flat buffers' elements, padding included
};

// Rank `rank`'s partition of `layout`.
Partition partition_of(const BucketLayout& layout, int rank);

}  // namespace hpc_train

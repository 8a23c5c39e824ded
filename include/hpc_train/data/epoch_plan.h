// The epoch plan: which samples each rank sees, in which order, as a pure function of
// (seed, epoch, dataset size, world size, rank). Semantics of torch's DistributedSampler:
// a permutation of (seed, epoch) (or the identity when not shuffling), then either padded by
// repeating its head up to a multiple of the world size, or cut down to one (drop_last), then
// split rank-strided: rank r takes positions r, r + W, r + 2W, ...
// The permutation does not depend on the world size, so N ranks with micro-batch b see, step by
// step, the same global batch as 1 rank with batch N*b.
#pragma once

#include <cstdint>
#include <vector>

namespace hpc_train {

enum class EpochTail {
  kPad,     // repeat the permutation's head so every rank gets ceil(n / W) samples (training)
  kDrop,    // drop the tail so every rank gets floor(n / W) samples (training, --drop-last)
  kUneven,  // no padding, no dropping: ranks differ by at most one sample (evaluation: exact counts)
};

// A permutation of 0..n-1 determined by (seed, epoch) alone: Fisher-Yates driven by our own
// SplitMix64/xoshiro generator and unbiased bounded draws, so that it is the same with every
// compiler and standard library.
std::vector<int64_t> epoch_permutation(uint64_t seed, int64_t epoch, int64_t dataset_size);

// Number of samples rank `rank` gets.
int64_t samples_for_rank(int64_t dataset_size, int world_size, int rank, EpochTail tail);

// The most evaluation samples any rank gets (rank 0's under kUneven), at least 1 for an empty
// split: the bound on an evaluation batch.
int64_t largest_evaluation_share(int64_t dataset_size, int world_size);

// The dataset indices rank `rank` visits in this epoch, in order. `first_position` > 0 resumes
// the epoch (Note [Resume position] in checkpoint.h): the permutation's positions before it were
// consumed already, possibly at another world size; the rest, from first_position on, is padded
// or cut to a multiple of this world size and split rank-strided as above. At the world size
// that consumed them (first_position a multiple of it), that is exactly the tail of the plan.
std::vector<int64_t> rank_epoch_indices(uint64_t seed, int64_t epoch, int64_t dataset_size,
                                        int world_size, int rank, EpochTail tail, bool shuffle,
                                        int64_t first_position = 0);

// rank_epoch_indices of every rank (element r is rank r's), from one permutation: what the
// owners of a memory store send is decided from every rank's plan (sample_store.h).
std::vector<std::vector<int64_t>> every_rank_epoch_indices(uint64_t seed, int64_t epoch,
                                                           int64_t dataset_size, int world_size,
                                                           EpochTail tail, bool shuffle,
                                                           int64_t first_position = 0);

// Batches of `batch_size` out of `count` samples, the last one partial (DataLoader's default).
int64_t batches_per_epoch(int64_t count, int64_t batch_size);

}  // namespace hpc_train

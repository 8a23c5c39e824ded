#include "hpc_train/data/epoch_plan.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>

#include "hpc_train/error.h"

namespace hpc_train {

namespace {

// Our own generator and draws, because std::shuffle and std::uniform_int_distribution are
// allowed to (and do) give different sequences in libstdc++, libc++ and MSVC: the plan must be
// the same wherever the job runs, and after a resume on another machine.

// SplitMix64 (Steele, Lea, Flood 2014): turns any 64-bit seed into well-mixed words; the
// recommended way to fill xoshiro's state.
uint64_t splitmix64_next(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// xoshiro256** (Blackman, Vigna 2018).
class Xoshiro256StarStar {
 public:
  Xoshiro256StarStar(uint64_t seed, int64_t epoch) {
    // The epoch is mixed on its own first, so that nearby (seed, epoch) pairs give unrelated
    // states rather than shifted copies of one stream.
    uint64_t epoch_state = static_cast<uint64_t>(epoch);
    uint64_t state = seed ^ splitmix64_next(epoch_state);
    for (uint64_t& word : s_) word = splitmix64_next(state);
  }

  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, range), range >= 1, without modulo bias (Lemire 2019, "Fast random integer
  // generation in an interval"): one multiplication, a division only on the rare rejection path.
  uint64_t bounded(uint64_t range) {
    __extension__ typedef unsigned __int128 Wide;  // GCC and Clang
    Wide product = static_cast<Wide>(next()) * range;
    uint64_t low = static_cast<uint64_t>(product);
    if (low < range) {
      const uint64_t threshold = (0 - range) % range;  // 2^64 mod range
      while (low < threshold) {
        product = static_cast<Wide>(next()) * range;
        low = static_cast<uint64_t>(product);
      }
    }
    return static_cast<uint64_t>(product >> 64);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

void check_arguments(int64_t dataset_size, int world_size, int rank) {
  if (dataset_size < 0) throw Error("epoch plan: dataset size " + std::to_string(dataset_size) + " < 0");
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw Error("epoch plan: rank " + std::to_string(rank) + " is outside world size " +
                std::to_string(world_size));
}

// Positions of the (padded or cut) epoch sequence: every rank's count times the world size,
// except kUneven, which keeps exactly the dataset.
int64_t epoch_length(int64_t dataset_size, int world_size, EpochTail tail) {
  switch (tail) {
    case EpochTail::kPad:
      return (dataset_size + world_size - 1) / world_size * world_size;
    case EpochTail::kDrop:
      return dataset_size / world_size * world_size;
    case EpochTail::kUneven:
      break;
  }
  return dataset_size;
}

}  // namespace

std::vector<int64_t> epoch_permutation(uint64_t seed, int64_t epoch, int64_t dataset_size) {
  if (dataset_size < 0) throw Error("epoch plan: dataset size " + std::to_string(dataset_size) + " < 0");
  std::vector<int64_t> permutation(static_cast<size_t>(dataset_size));
  std::iota(permutation.begin(), permutation.end(), int64_t{0});
  Xoshiro256StarStar generator(seed, epoch);
  // Fisher-Yates, from the back: position i swaps with a uniform position in [0, i].
  for (int64_t i = dataset_size - 1; i > 0; --i)
    std::swap(permutation[i], permutation[generator.bounded(static_cast<uint64_t>(i) + 1)]);
  return permutation;
}

int64_t samples_for_rank(int64_t dataset_size, int world_size, int rank, EpochTail tail) {
  check_arguments(dataset_size, world_size, rank);
  if (tail == EpochTail::kUneven)
    return rank < dataset_size ? (dataset_size - rank + world_size - 1) / world_size : 0;
  return epoch_length(dataset_size, world_size, tail) / world_size;
}

int64_t largest_evaluation_share(int64_t dataset_size, int world_size) {
  return std::max<int64_t>(1, samples_for_rank(dataset_size, world_size, 0, EpochTail::kUneven));
}

std::vector<std::vector<int64_t>> every_rank_epoch_indices(uint64_t seed, int64_t epoch,
                                                           int64_t dataset_size, int world_size,
                                                           EpochTail tail, bool shuffle,
                                                           int64_t first_position) {
  check_arguments(dataset_size, world_size, 0);
  if (first_position < 0)
    throw Error("epoch plan: first position " + std::to_string(first_position) + " < 0");
  std::vector<int64_t> order;
  if (shuffle) {
    order = epoch_permutation(seed, epoch, dataset_size);
  } else {
    order.resize(static_cast<size_t>(dataset_size));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  // Padding repeats the sequence from its head, wrapping as often as needed (torch's
  // DistributedSampler: whole copies when the padding exceeds the dataset). Nothing to pad an
  // empty dataset with, so it stays empty.
  // A resumed epoch pads or cuts what is left of the dataset after first_position.
  const int64_t left = std::max<int64_t>(0, dataset_size - first_position);
  const int64_t length = left == 0 ? 0 : epoch_length(left, world_size, tail);
  std::vector<std::vector<int64_t>> plans(static_cast<size_t>(world_size));
  for (std::vector<int64_t>& plan : plans) plan.reserve(static_cast<size_t>(length / world_size + 1));
  for (int64_t position = 0; position < length; ++position)
    plans[static_cast<size_t>(position % world_size)].push_back(
        order[static_cast<size_t>((first_position + position) % dataset_size)]);
  return plans;
}

std::vector<int64_t> rank_epoch_indices(uint64_t seed, int64_t epoch, int64_t dataset_size,
                                        int world_size, int rank, EpochTail tail, bool shuffle,
                                        int64_t first_position) {
  check_arguments(dataset_size, world_size, rank);
  return std::move(every_rank_epoch_indices(seed, epoch, dataset_size, world_size, tail, shuffle,
                                            first_position)[static_cast<size_t>(rank)]);
}

int64_t batches_per_epoch(int64_t count, int64_t batch_size) {
  if (batch_size < 1) throw Error("batch size " + std::to_string(batch_size) + " < 1");
  if (count < 0) throw Error("sample count " + std::to_string(count) + " < 0");
  return (count + batch_size - 1) / batch_size;
}

}  // namespace hpc_train

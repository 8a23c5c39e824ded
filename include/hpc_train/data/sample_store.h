// The read-once sample store (--data-store memory): each rank reads one contiguous share of the
// train split into host memory before training, and from then on every micro-batch is assembled
// by an all-to-all exchange from the ranks that hold its samples.
//
// Note [Read-once sample store]
// Rank r owns the train samples split_evenly(N, W)[r] (dataset_shards.h): [r*N/W, (r+1)*N/W),
// the first N mod W ranks one more. It reads them once, with read_samples of consecutive indices
// in pieces of kStoreReadPieceBytes (read_samples turns consecutive indices into one hyperslab
// read per file: Note [Reading runs] in dataset_file.cpp; shards included), so that the
// staging copy read_samples makes stays bounded. The epoch plan is a pure function of (seed,
// epoch, world size), so every rank computes every rank's plan (every_rank_epoch_indices) and
// knows, without asking, which of its samples each rank needs for micro-batch b: one
// MPI_Alltoallv per micro-batch moves them (image bytes and the label, in one record per
// sample), in the receiver's plan order. A rank therefore trains on exactly the samples, in
// exactly the order, that it reads from the file with --data-store file: the runs are bitwise
// equal. Every rank takes part in every exchange: the training tails (kPad, kDrop) give every
// rank the same number of samples, hence of micro-batches, and the trainer takes its steps in
// lockstep (max steps and stop signals are agreed); start_epoch refuses plans of unequal length
// rather than hang. The test split is read from the file as before (Evaluator).
//
// Note [Store exchange thread]: the exchange runs on the training thread, in
// EpochBatches::prepare_next, through the Communicator (so the watchdog names it when a rank is
// missing or late). prepare_next runs after the step before it is queued, so on a GPU the
// exchange overlaps that step's kernels; on the CPU it does not. A thread of its own would
// overlap it on the CPU too, but needs MPI_THREAD_MULTIPLE and a duplicated communicator, which
// the target MPI builds do not all grant, and collectives on two threads would need an order of
// their own; an exchange moves one micro-batch's bytes, small next to a step, and summary.json
// reports what it costs (data_store.exchange_ms_per_step). It is also where ranks wait for each
// other, so a rank's skew shows up in that time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hpc_train/data/batch_loader.h"
#include "hpc_train/data/dataset_file.h"
#include "hpc_train/data/dataset_shards.h"
#include "hpc_train/data/epoch_plan.h"

namespace hpc_train {

class Communicator;

// The store reads its share in pieces of this many bytes (at least one sample).
inline constexpr int64_t kStoreReadPieceBytes = int64_t{64} << 20;

// Who sends what in one micro-batch's exchange, for one rank (plan_batch_exchange).
struct BatchExchange {
  std::vector<int64_t> send_counts;   // samples to each rank
  // Offsets into this rank's share of the samples it sends: rank 0's, then rank 1's, ...; each
  // rank's in the order of that rank's batch.
  std::vector<int64_t> send_offsets;
  std::vector<int64_t> recv_counts;   // samples from each rank
  // For each sample received, in the order received (rank 0's first), its place in this rank's
  // batch.
  std::vector<int64_t> recv_slots;
};

// The exchange of one micro-batch for rank `rank`: `owned` is every rank's share
// (split_evenly), `rank_batches[r]` the dataset indices of rank r's micro-batch, in order.
BatchExchange plan_batch_exchange(const std::vector<SampleRange>& owned,
                                  const std::vector<std::vector<int64_t>>& rank_batches, int rank);

// Host memory a rank's share may take: --data-store-limit-mb `limit_mb`, or where that is 0 the
// node's MemAvailable (/proc/meminfo; its physical memory where that is missing) divided by the
// ranks on the node (MPI_COMM_TYPE_SHARED of `comm`; collective).
int64_t store_limit_bytes(int64_t limit_mb, MPI_Comm comm);

class SampleStore {
 public:
  // Reads this rank's share of the train split (Note [Read-once sample store]). Collective over
  // `comm`: when any rank's share (images and labels) is more than its `limit_bytes`, every rank
  // throws ConfigError before reading, that rank's naming the share, the limit and
  // --data-store-limit-mb. `dataset` and `comm` must outlive the store.
  SampleStore(const DatasetFile& dataset, Communicator& comm, int64_t limit_bytes);

  // This rank's share: the train samples [owned().begin, owned().begin + owned().count).
  const SampleRange& owned() const { return owned_[static_cast<size_t>(rank_)]; }
  // Bytes this rank read from the dataset for the store (its share's images).
  int64_t read_bytes() const { return read_bytes_; }
  // "train samples [B, E) into memory, SIZE, in T s": what this rank read, for the log.
  std::string describe_read() const;
  // Time spent in exchanges (planning, packing, MPI and unpacking), summed, in milliseconds.
  double exchange_ms() const { return exchange_ms_; }

  // Computes every rank's plan of an epoch (every_rank_epoch_indices, shuffled) and returns this
  // rank's, which the exchanges of the epoch then follow. Throws Error when the ranks' plans
  // differ in length (a tail that is not for training).
  std::vector<int64_t> start_epoch(uint64_t seed, int64_t epoch, EpochTail tail,
                                   int64_t first_position);
  // Micro-batch `batch` (from 0, in the plan of start_epoch) of `batch_size`, this rank's, into
  // `out`. Collective: every rank calls it for every micro-batch, in order.
  void exchange(int64_t batch, int64_t batch_size, HostBatch& out);

 private:
  const DatasetFile& dataset_;
  Communicator& comm_;
  int rank_;
  int64_t sample_bytes_;
  std::vector<SampleRange> owned_;  // every rank's share
  std::vector<uint8_t> images_;     // this rank's share, [count, C, H, W]
  std::vector<int64_t> labels_;
  std::vector<std::vector<int64_t>> plans_;  // the epoch's plan of every rank
  std::vector<uint8_t> send_records_;        // reused between exchanges
  std::vector<uint8_t> recv_records_;
  int64_t read_bytes_ = 0;
  double read_s_ = 0.0;
  double exchange_ms_ = 0.0;
};

}  // namespace hpc_train

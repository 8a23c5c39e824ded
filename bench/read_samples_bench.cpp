// read_samples_bench: the reading alone, at training's pace-free limit: each rank reads its
// share of one epoch's shuffled plan (the trainer's, rank_epoch_indices) through the trainer's
// BatchLoader and hands the batches to nobody, so that the figures are those of the reads in
// flight (Note [Reads in flight]) and not of the model or the input conversion; on the 2-core
// development machine hpc_train itself is bound by the CPU before the disk.
//   mpirun -np N read_samples_bench FILE READER_THREADS BATCHES MICRO_BATCH EPOCH
// EPOCH picks the plan (seed 42), so that runs on one file may read different samples. Prints
// one line a rank: "rank R samples/s S MB/s M storage_read_bytes B delivered_bytes D", the rate
// over the slowest rank's time (every rank waits for it in training).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "hpc_train/data/batch_loader.h"
#include "hpc_train/data/dataset_file.h"
#include "hpc_train/data/epoch_plan.h"
#include "hpc_train/error.h"
#include "hpc_train/monitor/storage_io.h"

namespace {

using namespace hpc_train;

constexpr uint64_t kSeed = 42;  // hpc_train's default --seed
constexpr int kPrefetchBatches = 4;  // hpc_train's default --prefetch

int run(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr,
                 "usage: read_samples_bench FILE READER_THREADS BATCHES MICRO_BATCH EPOCH\n");
    return 2;
  }
  int rank = 0, ranks = 1, provided = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  MPI_Query_thread(&provided);
  const int reader_threads = std::stoi(argv[2]);
  const int64_t batches = std::stoll(argv[3]), micro_batch = std::stoll(argv[4]);
  const DatasetFile file = DatasetFile::open(
      argv[1], preferred_file_access(provided == MPI_THREAD_MULTIPLE), MPI_COMM_WORLD,
      reader_threads);
  std::vector<int64_t> plan = rank_epoch_indices(kSeed, std::stoll(argv[5]),
                                                 file.info().train_size, ranks, rank,
                                                 EpochTail::kPad, true);
  plan.resize(std::min<size_t>(plan.size(), static_cast<size_t>(batches * micro_batch)));
  const std::optional<StorageReadBytes> before = process_storage_reads();
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = std::chrono::steady_clock::now();
  int64_t delivered_bytes = 0;
  {
    BatchLoader loader(file, Split::kTrain, plan, micro_batch, kPrefetchBatches);
    HostBatch batch;
    while (loader.next(batch)) delivered_bytes += static_cast<int64_t>(batch.images.size());
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::optional<StorageReadBytes> read =
      storage_reads_between(before, process_storage_reads());
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  const double samples = static_cast<double>(plan.size());
  std::printf("rank %d samples/s %.1f MB/s %.1f storage_read_bytes %lld delivered_bytes %lld\n",
              rank, samples / seconds, static_cast<double>(delivered_bytes) / seconds / 1e6,
              static_cast<long long>(read ? read->storage_read_bytes : -1),
              static_cast<long long>(delivered_bytes));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int code = 1;
  try {
    code = run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "read_samples_bench: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  MPI_Finalize();
  return code;
}

#include "hpc_train/data/sample_store.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>

#include "hpc_train/comm/comm.h"
#include "hpc_train/error.h"
#include "hpc_train/monitor/metrics.h"
#include "hpc_train/runtime/runtime.h"

namespace hpc_train {

namespace {

// The rank whose share holds train sample `index`.
size_t owner_of(const std::vector<SampleRange>& owned, int64_t index) {
  const auto after = std::upper_bound(
      owned.begin(), owned.end(), index,
      [](int64_t i, const SampleRange& range) { return i < range.begin; });
  return static_cast<size_t>(after - owned.begin() - 1);
}

// MemAvailable of /proc/meminfo in bytes, or -1 where there is none.
int64_t mem_available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream fields(line);
    std::string key;
    int64_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

}  // namespace

BatchExchange plan_batch_exchange(const std::vector<SampleRange>& owned,
                                  const std::vector<std::vector<int64_t>>& rank_batches, int rank) {
  const size_t ranks = owned.size();
  BatchExchange plan;
  plan.send_counts.assign(ranks, 0);
  plan.recv_counts.assign(ranks, 0);
  const SampleRange& mine = owned[static_cast<size_t>(rank)];
  for (size_t to = 0; to < ranks; ++to) {
    for (int64_t index : rank_batches[to]) {
      if (index < mine.begin || index >= mine.begin + mine.count) continue;
      plan.send_offsets.push_back(index - mine.begin);
      ++plan.send_counts[to];
    }
  }
  // What each owner sends arrives in its owner's order, rank 0's first: the places of this
  // rank's batch grouped by owner, in batch order within each (a stable counting sort).
  const std::vector<int64_t>& batch = rank_batches[static_cast<size_t>(rank)];
  std::vector<size_t> owner(batch.size());
  for (size_t slot = 0; slot < batch.size(); ++slot) {
    owner[slot] = owner_of(owned, batch[slot]);
    ++plan.recv_counts[owner[slot]];
  }
  std::vector<int64_t> next(ranks, 0);
  std::partial_sum(plan.recv_counts.begin(), plan.recv_counts.end() - 1, next.begin() + 1);
  plan.recv_slots.resize(batch.size());
  for (size_t slot = 0; slot < batch.size(); ++slot)
    plan.recv_slots[static_cast<size_t>(next[owner[slot]]++)] = static_cast<int64_t>(slot);
  return plan;
}

int64_t store_limit_bytes(int64_t limit_mb, MPI_Comm comm) {
  if (limit_mb > 0) return limit_mb << 20;
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int ranks_on_node = 1;
  MPI_CHECK(MPI_Comm_size(node, &ranks_on_node));
  MPI_CHECK(MPI_Comm_free(&node));
  const int64_t available = mem_available_bytes();
  return (available >= 0 ? available : physical_memory_bytes()) / std::max(1, ranks_on_node);
}

SampleStore::SampleStore(const DatasetFile& dataset, Communicator& comm, int64_t limit_bytes)
    : dataset_(dataset),
      comm_(comm),
      rank_(comm.rank()),
      sample_bytes_(dataset.info().sample_bytes()),
      owned_(split_evenly(dataset.info().train_size, comm.size())) {
  const SampleRange share = owned();
  // In double: a bound, which cannot overflow.
  const double share_bytes =
      static_cast<double>(share.count) * static_cast<double>(sample_bytes_ + sizeof(int64_t));
  const bool over = share_bytes > static_cast<double>(limit_bytes);
  // Agreed first, so that no rank reads (or waits in an exchange) while another refuses.
  const int64_t ranks_over =
      comm_.all_reduce_count(over ? 1 : 0, ReduceOp::kSum, "data store limit");
  if (over)
    throw ConfigError("--data-store memory: rank " + std::to_string(rank_) + "'s share of the "
                      "train split of " + dataset.path() + " (" + std::to_string(share.count) +
                      " samples) needs " + memory_text(share_bytes) + " of host memory, more "
                      "than its limit of " + memory_text(static_cast<double>(limit_bytes)) +
                      " (--data-store-limit-mb; 0 = MemAvailable / ranks on the node); use more "
                      "ranks or nodes, a larger --data-store-limit-mb, or --data-store file");
  if (ranks_over > 0)
    throw ConfigError("--data-store memory: " + std::to_string(ranks_over) + " rank(s)' share "
                      "of the train split of " + dataset.path() + " exceeds their memory limit "
                      "(--data-store-limit-mb; their messages say by how much)");

  const Stopwatch read;
  images_.resize(static_cast<size_t>(share.count * sample_bytes_));
  labels_.resize(static_cast<size_t>(share.count));
  const int64_t piece_samples = std::max<int64_t>(1, kStoreReadPieceBytes / sample_bytes_);
  std::vector<int64_t> indices;
  for (int64_t done = 0; done < share.count; done += piece_samples) {
    const int64_t count = std::min(piece_samples, share.count - done);
    indices.resize(static_cast<size_t>(count));
    std::iota(indices.begin(), indices.end(), share.begin + done);
    dataset_.read_samples(Split::kTrain, indices, images_.data() + done * sample_bytes_,
                          labels_.data() + done);
    read_bytes_ += count * sample_bytes_;
  }
  read_s_ = read.elapsed_ms() / 1e3;
}

std::string SampleStore::describe_read() const {
  char text[160];
  std::snprintf(text, sizeof text, "train samples [%lld, %lld) into memory, %s, in %.2f s",
                static_cast<long long>(owned().begin),
                static_cast<long long>(owned().begin + owned().count),
                memory_text(static_cast<double>(read_bytes_)).c_str(), read_s_);
  return text;
}

std::vector<int64_t> SampleStore::start_epoch(uint64_t seed, int64_t epoch, EpochTail tail,
                                              int64_t first_position) {
  plans_ = every_rank_epoch_indices(seed, epoch, dataset_.info().train_size, comm_.size(), tail,
                                    /*shuffle=*/true, first_position);
  for (const std::vector<int64_t>& plan : plans_)
    if (plan.size() != plans_.front().size())
      throw Error("data store: the ranks' epoch plans differ in length (" +
                  std::to_string(plans_.front().size()) + " and " + std::to_string(plan.size()) +
                  " samples), so they would not exchange every micro-batch together");
  return plans_[static_cast<size_t>(rank_)];
}

void SampleStore::exchange(int64_t batch, int64_t batch_size, HostBatch& out) {
  Stopwatch watch;
  const int64_t begin = batch * batch_size;
  std::vector<std::vector<int64_t>> rank_batches;
  rank_batches.reserve(plans_.size());
  for (const std::vector<int64_t>& plan : plans_) {
    const int64_t end = std::min<int64_t>(begin + batch_size, plan.size());
    rank_batches.emplace_back(plan.begin() + std::min<int64_t>(begin, end), plan.begin() + end);
  }
  const BatchExchange plan = plan_batch_exchange(owned_, rank_batches, rank_);

  // One record a sample: its image bytes, then its label.
  const int64_t record_bytes = sample_bytes_ + static_cast<int64_t>(sizeof(int64_t));
  send_records_.resize(plan.send_offsets.size() * static_cast<size_t>(record_bytes));
  const size_t image_bytes = static_cast<size_t>(sample_bytes_);
  uint8_t* record = send_records_.data();
  for (int64_t offset : plan.send_offsets) {
    std::memcpy(record, images_.data() + offset * sample_bytes_, image_bytes);
    std::memcpy(record + sample_bytes_, &labels_[static_cast<size_t>(offset)], sizeof(int64_t));
    record += record_bytes;
  }
  std::vector<int64_t> send_bytes(plan.send_counts), recv_bytes(plan.recv_counts);
  for (int64_t& bytes : send_bytes) bytes *= record_bytes;
  for (int64_t& bytes : recv_bytes) bytes *= record_bytes;
  recv_records_.resize(plan.recv_slots.size() * static_cast<size_t>(record_bytes));
  comm_.all_to_all_bytes(send_records_.data(), send_bytes, recv_records_.data(), recv_bytes,
                         "data store batch " + std::to_string(batch));

  const int64_t size = static_cast<int64_t>(plan.recv_slots.size());
  out.size = size;
  out.images.resize(static_cast<size_t>(size * sample_bytes_));
  out.labels.resize(static_cast<size_t>(size));
  record = recv_records_.data();
  for (int64_t slot : plan.recv_slots) {
    std::memcpy(out.images.data() + slot * sample_bytes_, record, image_bytes);
    std::memcpy(&out.labels[static_cast<size_t>(slot)], record + sample_bytes_, sizeof(int64_t));
    record += record_bytes;
  }
  exchange_ms_ += watch.elapsed_ms();
}

}  // namespace hpc_train

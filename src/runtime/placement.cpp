// Note [Agreed placement] (placement.h): the decision over every rank's report, and the
// gathering of the reports. The report itself comes from placement_cpu.cpp or
// placement_cuda.cpp, whichever the build chose.
#include "hpc_train/runtime/placement.h"

#include <algorithm>
#include <numeric>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>

#include "hpc_train/error.h"
#include "hpc_train/runtime/runtime.h"

namespace hpc_train {

namespace {

// "0,2,5-9": ascending rank numbers, runs of three or more as ranges.
std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size();) {
    size_t end = i;
    while (end + 1 < ranks.size() && ranks[end + 1] == ranks[end] + 1) ++end;
    if (!text.empty()) text += ",";
    if (end >= i + 2) {
      text += std::to_string(ranks[i]) + "-" + std::to_string(ranks[end]);
    } else {
      text += std::to_string(ranks[i]);
      end = i;
    }
    i = end + 1;
  }
  return text;
}

// "rank 1 (node b)", "ranks 0,2 (node a), 4 (node c)": `ranks` (ascending) grouped by node, the
// nodes in the order of their first rank.
std::string describe_ranks(const std::vector<int>& ranks, const std::vector<RankDevices>& reports) {
  std::vector<std::pair<std::string, std::vector<int>>> by_node;
  for (int r : ranks) {
    auto node = std::find_if(by_node.begin(), by_node.end(),
                             [&](const auto& entry) { return entry.first == reports[r].host; });
    if (node == by_node.end()) node = by_node.insert(by_node.end(), {reports[r].host, {}});
    node->second.push_back(r);
  }
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t n = 0; n < by_node.size(); ++n)
    text += (n > 0 ? ", " : "") + rank_list(by_node[n].second) + " (node " + by_node[n].first + ")";
  return text;
}

// "sees" / "see" after describe_ranks.
const char* verb_s(const std::vector<int>& ranks, const char* singular, const char* plural) {
  return ranks.size() == 1 ? singular : plural;
}

// Whether the ranks run on GPUs; ConfigError where the ranks cannot agree.
bool decide_cuda(DeviceChoice device, const std::vector<RankDevices>& ranks) {
  if (device == DeviceChoice::kCpu) return false;
  std::vector<int> with_gpu, without_gpu;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r)
    (ranks[r].visible_gpus > 0 ? with_gpu : without_gpu).push_back(r);
  if (without_gpu.empty()) return true;
  if (with_gpu.empty()) {
    if (device == DeviceChoice::kAuto) return false;
    throw ConfigError("--device cuda: " + describe_ranks(without_gpu, ranks) + " " +
                      verb_s(without_gpu, "sees", "see") +
                      " no GPU (LibTorch sees none, or this hpc_train was built without CUDA); "
                      "use --device cpu");
  }
  throw ConfigError("--device " + to_string(device) + ": " + describe_ranks(with_gpu, ranks) + " " +
                    verb_s(with_gpu, "sees", "see") + " a GPU, " +
                    describe_ranks(without_gpu, ranks) + " " +
                    verb_s(without_gpu, "sees", "see") +
                    " none; make a GPU visible to every rank, or use --device cpu");
}

// The groups of ranks that would share one GPU (the same bus id on the same node), in the order
// of their first rank; empty when every rank has a GPU of its own.
std::vector<std::vector<int>> ranks_sharing_a_gpu(const std::vector<RankDevices>& ranks) {
  std::map<std::pair<std::string, std::string>, std::vector<int>> by_gpu;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r)
    by_gpu[{ranks[r].host, ranks[r].bus_id}].push_back(r);
  std::vector<std::vector<int>> shared;
  for (auto& entry : by_gpu)
    if (entry.second.size() > 1) shared.push_back(std::move(entry.second));
  std::sort(shared.begin(), shared.end());
  return shared;
}

}  // namespace

std::string Placement::describe() const {
  return (cuda ? "GPU " + std::to_string(cuda_device) : std::string("CPU")) + ", " +
         (backend == CommBackendKind::kNccl ? "nccl"
          : backend == CommBackendKind::kNone ? "no communication"
                                              : "mpi");
}

int choose_cuda_device(int local_rank, int visible_gpus) { return local_rank % visible_gpus; }

namespace {

// The variables that name a local rank, each launcher's; Slurm's last: a batch script's own
// environment has SLURM_LOCALID=0 for the mpirun inside it.
constexpr const char* kLocalRankVariables[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                                "PALS_LOCAL_RANKID", "SLURM_LOCALID"};

// A non-negative whole number, or nullopt.
std::optional<long> whole_number(const char* text) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < 0) return std::nullopt;
  return value;
}

// No launcher at all: a process started alone (the launchers' rank variables absent).
bool started_alone() {
  for (const char* name : kLocalRankVariables)
    if (std::getenv(name)) return false;
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(name)) return false;
  return true;
}

}  // namespace

Placement agree_placement(const Runtime& runtime, const TrainConfig& config) {
  RankDevices devices;
  run_agreed_phase(runtime,
                   [&] { devices = probe_devices(runtime.hostname(), runtime.local_rank()); });
  Placement placement;
  run_agreed_phase(runtime, [&] {
    placement = resolve_placement(config, runtime.world(), devices);
    check_mpi_thread_level(placement, runtime.thread_level());  // Note [MPI thread level]
  });
  return placement;
}

int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* value = std::getenv(name)) return std::atoi(value);
  return 0;
}

std::optional<int> launcher_local_rank() {
  for (const char* name : kLocalRankVariables)
    if (const char* value = std::getenv(name)) {
      const std::optional<long> rank = whole_number(value);
      if (!rank) return std::nullopt;
      return static_cast<int>(*rank);
    }
  // A process started alone is its node's only rank.
  if (started_alone()) return 0;
  return std::nullopt;
}

std::optional<bool> launcher_one_node() {
  const char* world = std::getenv("OMPI_COMM_WORLD_SIZE");
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (world && local) {
    const std::optional<long> world_size = whole_number(world), local_size = whole_number(local);
    if (!world_size || !local_size) return std::nullopt;
    return *world_size == *local_size;
  }
  if (started_alone()) return true;
  return std::nullopt;
}

std::vector<Placement> decide_placement(const TrainConfig& config,
                                        const std::vector<RankDevices>& ranks, bool nccl_built) {
  const bool cuda = decide_cuda(config.device, ranks);
  CommBackendKind backend = CommBackendKind::kMpi;
  if (config.backend == BackendChoice::kNone ||
      (config.backend == BackendChoice::kAuto && ranks.size() == 1)) {
    backend = CommBackendKind::kNone;
  } else if (config.backend == BackendChoice::kNccl || config.backend == BackendChoice::kAuto) {
    const bool insist = config.backend == BackendChoice::kNccl;
    if (insist && !nccl_built)
      throw ConfigError("--backend nccl: this hpc_train was built with a LibTorch without CUDA");
    if (insist && !cuda)
      throw ConfigError("--backend nccl needs a GPU of its own for every rank, and the ranks run "
                        "on the CPU (--device " + to_string(config.device) +
                        "); use --backend mpi");
    const std::vector<std::vector<int>> shared = cuda ? ranks_sharing_a_gpu(ranks)
                                                      : std::vector<std::vector<int>>{};
    if (insist && !shared.empty()) {
      std::string sharing;
      for (const std::vector<int>& group : shared)
        sharing += (sharing.empty() ? "" : ", ") + describe_ranks(group, ranks) + " share GPU " +
                   ranks[group.front()].bus_id;
      throw ConfigError("--backend nccl needs a GPU of its own for every rank: " + sharing +
                        "; use --backend mpi, or one GPU per rank (e.g. srun --gpus-per-task=1)");
    }
    if (cuda && nccl_built && shared.empty()) backend = CommBackendKind::kNccl;
  }
  std::vector<Placement> placements(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    placements[r].cuda = cuda;
    if (cuda)
      placements[r].cuda_device = choose_cuda_device(ranks[r].local_rank, ranks[r].visible_gpus);
    placements[r].backend = backend;
  }
  return placements;
}

namespace {

// One rank's report as fixed-size bytes, for MPI_Allgather. Longer strings are cut (host names
// have at most 64 characters on Linux, bus ids 16).
struct RankRecord {
  char host[256];
  char bus_id[64];
  int32_t local_rank;
  int32_t visible_gpus;
};

void copy_cut(char* destination, size_t capacity, const std::string& source) {
  const size_t n = std::min(capacity - 1, source.size());
  std::memcpy(destination, source.data(), n);
  destination[n] = '\0';
}

}  // namespace

namespace {

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    default: return "MPI_THREAD_MULTIPLE";
  }
}

}  // namespace

void check_mpi_thread_level(const Placement& placement, int granted) {
  const bool gpu_mpi = placement.cuda && placement.backend == CommBackendKind::kMpi;
  const int needed = gpu_mpi ? MPI_THREAD_SERIALIZED : MPI_THREAD_FUNNELED;
  if (granted >= needed) return;
  throw ConfigError(std::string("MPI granted ") + thread_level_name(granted) + " (asked for " +
                    "MPI_THREAD_MULTIPLE); " +
                    (gpu_mpi ? "the MPI backend on a GPU calls MPI from autograd's device "
                               "thread and needs "
                             : "training needs ") +
                    thread_level_name(needed) +
                    (gpu_mpi ? ": use the NCCL backend, or an MPI built with thread support"
                             : ": use an MPI built with thread support"));
}

Placement resolve_placement(const TrainConfig& config, MPI_Comm comm, const RankDevices& mine,
                            bool nccl_built) {
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  RankRecord record{};
  copy_cut(record.host, sizeof(record.host), mine.host);
  copy_cut(record.bus_id, sizeof(record.bus_id), mine.bus_id);
  record.local_rank = mine.local_rank;
  record.visible_gpus = mine.visible_gpus;
  std::vector<RankRecord> records(static_cast<size_t>(size));
  MPI_CHECK(MPI_Allgather(&record, sizeof(RankRecord), MPI_BYTE, records.data(),
                          sizeof(RankRecord), MPI_BYTE, comm));
  std::vector<RankDevices> reports(records.size());
  for (size_t r = 0; r < records.size(); ++r) {
    reports[r].host = records[r].host;
    reports[r].bus_id = records[r].bus_id;
    reports[r].local_rank = records[r].local_rank;
    reports[r].visible_gpus = records[r].visible_gpus;
  }
  Placement placement = decide_placement(config, reports, nccl_built)[static_cast<size_t>(rank)];
  std::vector<int> every_rank(records.size());
  std::iota(every_rank.begin(), every_rank.end(), 0);
  placement.ranks_by_node = describe_ranks(every_rank, reports);
  return placement;
}

}  // namespace hpc_train

#include "hpc_train/runtime/runtime.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "hpc_train/error.h"

namespace hpc_train {

std::string describe_failed_call(const char* file, int line, const char* expr,
                                 const std::string& detail) {
  return std::string(file) + ":" + std::to_string(line) + ": " + expr + " failed: " + detail;
}

std::string mpi_error_string(int mpi_error_code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(mpi_error_code, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(mpi_error_code);
  return std::string(text, length);
}

void prefer_single_node_transport(std::optional<bool> one_node) {
  if (one_node == true) setenv("OMPI_MCA_pml", "ob1", /*overwrite=*/0);  // a user's choice stays
}

Runtime::Runtime(int* argc, char*** argv, std::optional<bool> one_node) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    prefer_single_node_transport(one_node);  // Note [Single-node MPI transport]
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &thread_level_));
  } else {
    MPI_CHECK(MPI_Query_thread(&thread_level_));
  }
  // Library code reports MPI failures as exceptions (MPI_CHECK) instead of MPI's default abort.
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size_));
  MPI_Comm node_comm = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL,
                                &node_comm));
  MPI_CHECK(MPI_Comm_rank(node_comm, &local_rank_));
  MPI_CHECK(MPI_Comm_size(node_comm, &local_size_));
  MPI_Comm_free(&node_comm);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  hostname_ = host;
}

Runtime::~Runtime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::string Runtime::rank_label() const {
  return "rank " + std::to_string(rank_) + "@" + hostname_;
}

namespace {

// Every rank's message at rank 0 (empty strings from ranks that did not fail).
std::vector<std::string> gather_messages(const Runtime& runtime, const std::string& message) {
  int length = static_cast<int>(message.size());
  std::vector<int> lengths(runtime.world_size());
  MPI_CHECK(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, runtime.world()));
  std::vector<int> offsets(runtime.world_size(), 0);
  for (int r = 1; r < runtime.world_size(); ++r) offsets[r] = offsets[r - 1] + lengths[r - 1];
  std::string all(runtime.rank() == 0 ? offsets.back() + lengths.back() : 0, '\0');
  MPI_CHECK(MPI_Gatherv(message.data(), length, MPI_CHAR, all.data(), lengths.data(),
                        offsets.data(), MPI_CHAR, 0, runtime.world()));
  std::vector<std::string> messages;
  if (runtime.rank() == 0)
    for (int r = 0; r < runtime.world_size(); ++r)
      messages.push_back(all.substr(offsets[r], lengths[r]));
  return messages;
}

}  // namespace

// Note [Ending the job]: see runtime.h. An agreed phase costs two small collectives and lets a
// configuration or input error, which every rank usually sees alike, print once and exit with
// its own code instead of an MPI_Abort storm.
void run_agreed_phase(const Runtime& runtime, const std::function<void()>& phase) {
  std::string message;
  int exit_code = kExitOk;
  try {
    phase();
  } catch (const Error& e) {
    message = e.what();
    exit_code = e.exit_code();
  } catch (const std::exception& e) {
    message = e.what();
    exit_code = kExitRuntimeError;
  }
  int worst = exit_code;
  MPI_CHECK(MPI_Allreduce(&exit_code, &worst, 1, MPI_INT, MPI_MAX, runtime.world()));
  if (worst == kExitOk) return;
  const std::vector<std::string> messages = gather_messages(runtime, message);
  if (runtime.rank() == 0) {
    // Each distinct message once, with the ranks that raised it.
    std::map<std::string, std::string> ranks_by_message;
    for (int r = 0; r < runtime.world_size(); ++r) {
      if (messages[r].empty()) continue;
      std::string& ranks = ranks_by_message[messages[r]];
      ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
    }
    for (const auto& [text, ranks] : ranks_by_message)
      std::fprintf(stderr, "[rank %s@%s] error: %s\n", ranks.c_str(), runtime.hostname().c_str(),
                   text.c_str());
    std::fflush(stderr);
  }
  throw JobEnded{worst};
}

int run_or_abort(const Runtime& runtime, const std::function<int()>& body) {
  int exit_code = kExitRuntimeError;
  std::string message;
  try {
    return body();
  } catch (const JobEnded& ended) {
    return ended.exit_code;
  } catch (const Error& e) {
    message = e.what();
    exit_code = e.exit_code();
  } catch (const std::exception& e) {
    message = e.what();
  }
  std::fprintf(stderr, "[%s] error: %s\n", runtime.rank_label().c_str(), message.c_str());
  std::fflush(stderr);
  if (runtime.world_size() > 1) MPI_Abort(MPI_COMM_WORLD, exit_code);
  return exit_code;
}

int compute_threads_per_rank(int local_size, int requested) {
  const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Threads beyond the node's hardware threads only compete for them, and a typo's worth of them
  // stalls the start (as --threads-per-rank 100000 did: bench/results-notes.md, runtime.cpp
  // compute_threads_per_rank).
  if (requested > hardware)
    throw ConfigError("--threads-per-rank " + std::to_string(requested) + ": more than the " +
                      std::to_string(hardware) + " hardware threads of this node");
  if (requested > 0) return requested;
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int allowed = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : hardware;
  // A rank bound to its own cores owns them; unbound ranks share the node's cores evenly.
  return std::max(1, std::min(allowed, hardware / std::max(1, local_size)));
}

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_bytes = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_bytes <= 0)
    throw Error("sysconf cannot say how much memory this node has");
  return static_cast<int64_t>(pages) * page_bytes;
}

std::string memory_text(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  size_t unit = 0;
  while (bytes >= 1024.0 && unit + 1 < std::size(kUnits)) {
    bytes /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.4g %s", bytes, kUnits[unit]);
  return text;
}

bool stdout_is_terminal() {
  if (!isatty(STDOUT_FILENO)) return false;
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) return true;
  char target[256] = {};
  const std::string parent_stdout = "/proc/" + std::to_string(getppid()) + "/fd/1";
  if (readlink(parent_stdout.c_str(), target, sizeof(target) - 1) <= 0) return false;
  const std::string device(target);
  return device.rfind("/dev/pts/", 0) == 0 || device.rfind("/dev/tty", 0) == 0;
}

std::string broadcast_string(MPI_Comm comm, const std::string& value, int root) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  long long length = static_cast<long long>(value.size());
  MPI_CHECK(MPI_Bcast(&length, 1, MPI_LONG_LONG, root, comm));
  std::string result = rank == root ? value : std::string(static_cast<size_t>(length), '\0');
  MPI_CHECK(MPI_Bcast(result.data(), static_cast<int>(length), MPI_CHAR, root, comm));
  return result;
}

}  // namespace hpc_train

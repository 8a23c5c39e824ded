// The environment switches of Note [Test hooks]. TestHooks' members are defined next to the
// private state they reach (device_input.cpp, zero_optimizer.cpp).
#include "hpc_train/runtime/test_hooks.h"

#include <chrono>
#include <climits>
#include <cstdlib>

#include "hpc_train/error.h"

namespace hpc_train {

namespace {

// `text` as a rank: decimal digits and nothing else, within int; -1 otherwise.
int parse_rank(const char* text) {
  char* end = nullptr;
  const long rank = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || rank < 0 || rank > INT_MAX) return -1;
  return static_cast<int>(rank);
}

// The switch's value, or nullptr where it is unset or empty.
const char* switch_value(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr || *value == '\0' ? nullptr : value;
}

}  // namespace

bool test_fault(const char* kind, int rank) {
  const char* value = switch_value("HPC_TRAIN_TEST_FAULT");
  if (value == nullptr) return false;
  const std::string text = value;
  const size_t at = text.find('@');
  const std::string asked = text.substr(0, at);
  const int asked_rank = at == std::string::npos ? -1 : parse_rank(text.c_str() + at + 1);
  const bool known = asked == "init-weights" || asked == "alloc" || asked == "resident-upload" ||
                     asked == "capture";
  if (!known || asked_rank < 0)
    throw Error("HPC_TRAIN_TEST_FAULT=" + text +
                ": expected KIND@RANK, KIND one of init-weights, alloc, resident-upload, capture");
  return asked == kind && asked_rank == rank;
}

int test_stall_replay_rank() {
  const char* value = switch_value("HPC_TRAIN_TEST_STALL_REPLAY_RANK");
  if (value == nullptr) return -1;
  const int rank = parse_rank(value);
  if (rank < 0)
    throw Error(std::string("HPC_TRAIN_TEST_STALL_REPLAY_RANK=") + value +
                ": not a rank number (a fault switch for tests; unset it)");
  return rank;
}

void announce_test_stall_replay(int rank, const std::string& label) {
  const auto since_epoch = std::chrono::system_clock::now().time_since_epoch();
  std::fprintf(stderr,
               "[rank %d] test fault HPC_TRAIN_TEST_STALL_REPLAY_RANK: graph replay of %s held up "
               "on the GPU for %g s; stall begins at %lld ms\n",
               rank, label.c_str(), kTestStallReplayS,
               static_cast<long long>(
                   std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch).count()));
  std::fflush(stderr);
}

SampleTrace::SampleTrace(int rank) {
  const char* prefix = switch_value("HPC_TRAIN_TEST_SAMPLE_TRACE");
  if (prefix == nullptr) return;
  const std::string path = std::string(prefix) + "." + std::to_string(rank);
  file_ = std::fopen(path.c_str(), "a");
  if (file_ == nullptr) throw Error("HPC_TRAIN_TEST_SAMPLE_TRACE: cannot open " + path);
}

SampleTrace::~SampleTrace() {
  if (file_ != nullptr) std::fclose(file_);
}

void SampleTrace::write(int64_t epoch, int64_t step, const std::vector<int64_t>& indices) {
  std::fprintf(file_, "%lld %lld", static_cast<long long>(epoch), static_cast<long long>(step));
  for (int64_t index : indices) std::fprintf(file_, " %lld", static_cast<long long>(index));
  std::fprintf(file_, "\n");
  std::fflush(file_);
}

}  // namespace hpc_train

#include "hpc_train/runtime/test_fault.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "hpc_train/error.h"

namespace hpc_train {

bool test_fault(const char* kind, int rank) {
  const char* value = std::getenv("HPC_TRAIN_TEST_FAULT");
  if (value == nullptr || *value == '\0') return false;
  const std::string text = value;
  const size_t at = text.find('@');
  const std::string asked = text.substr(0, at);
  char* end = nullptr;
  const long asked_rank =
      at == std::string::npos ? -1 : std::strtol(text.c_str() + at + 1, &end, 10);
  const bool known = asked == "init-weights" || asked == "alloc" || asked == "resident-upload" ||
                     asked == "capture";
  if (!known || asked_rank < 0 || end == text.c_str() + at + 1 || *end != '\0')
    throw Error("HPC_TRAIN_TEST_FAULT=" + text +
                ": expected KIND@RANK, KIND one of init-weights, alloc, resident-upload, capture");
  return asked == kind && asked_rank == rank;
}

}  // namespace hpc_train

// GoogleTest main for tests that run under mpirun: MPI is initialised once, rank 0 prints the
// usual progress, the other ranks print only their failures (prefixed with the rank), and the
// job fails when any rank failed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "hpc_train/runtime/runtime.h"

namespace {

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(std::string label) : label_(std::move(label)) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[%s] %s:%d: failure\n%s\n", label_.c_str(),
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }

 private:
  std::string label_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  hpc_train::Runtime runtime(&argc, &argv);
  if (runtime.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(runtime.rank_label()));
  }
  const int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&local_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any_failed;
}

// GraphedStep (graphed_step.h): which steps run from the CUDA graph, and what a failed capture
// does. The captures themselves run on a GPU (test_equivalence_gpu, test_zero_gpu, the graph
// replay tests); a CPU build cannot capture, which is the failure checked here.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include "hpc_train/comm/comm.h"
#include "hpc_train/error.h"
#include "hpc_train/monitor/run_report.h"
#include "hpc_train/train/graphed_step.h"

namespace {

using hpc_train::GraphedStep;
using hpc_train::kEagerStepsBeforeCapture;

TEST(GraphedStep, OnlyFullSynchronisedStepsAfterTheWarmUpRunFromTheGraph) {
  const GraphedStep graphed(/*enabled=*/true, /*required=*/false);
  EXPECT_TRUE(graphed.wanted(true, true, true, kEagerStepsBeforeCapture));
  EXPECT_FALSE(graphed.wanted(/*sync=*/false, true, true, kEagerStepsBeforeCapture));
  EXPECT_FALSE(graphed.wanted(true, /*layout_final=*/false, true, kEagerStepsBeforeCapture));
  EXPECT_FALSE(graphed.wanted(true, true, /*full_batch=*/false, kEagerStepsBeforeCapture));
  EXPECT_FALSE(graphed.wanted(true, true, true, kEagerStepsBeforeCapture - 1));
  EXPECT_FALSE(GraphedStep(/*enabled=*/false, false).wanted(true, true, true, 100));
}

TEST(GraphedStep, AFailedCaptureFallsBackToEagerStepsOrThrowsWhenRequired) {
  if (hpc_train::cuda_graphs_available()) GTEST_SKIP() << "this build captures graphs";
  hpc_train::Communicator comm(MPI_COMM_WORLD);
  hpc_train::TrainerOutput quiet;
  quiet.print = false;
  hpc_train::RunReporter reporter(quiet, comm.rank());
  const hpc_train::DeviceBatch batch{torch::zeros({2, 1, 4, 4}), torch::zeros({2}, torch::kLong)};
  const auto enqueue = [](const hpc_train::DeviceBatch&) {};
  const auto discard = [] {};

  GraphedStep optional(/*enabled=*/true, /*required=*/false);
  EXPECT_FALSE(optional.run(batch, 0, enqueue, discard, comm, reporter));
  EXPECT_FALSE(optional.take_captured_now());
  // No capture is tried again: the steps run eagerly.
  EXPECT_FALSE(optional.wanted(true, true, true, kEagerStepsBeforeCapture));

  GraphedStep required(/*enabled=*/true, /*required=*/true);  // --cuda-graph on
  EXPECT_THROW(required.run(batch, 0, enqueue, discard, comm, reporter), hpc_train::Error);
}

}  // namespace

// Communicator collectives with closed-form results, at 1, 2 and 3 ranks, each with the watchdog
// off and on (a timeout must not change a result). The DISABLED_ cases stall on purpose: they end
// the job, and test_comm_timeout.sh runs them and checks how.
//
// Built a second time with HPC_TRAIN_TEST_ON_GPU (GPU build, label gpu, 1 rank): the NCCL
// backend's watchdog, with CUDA graph capture and watched replays, and aborts racing launches,
// instead.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hpc_train/comm/comm.h"
#include "hpc_train/error.h"

#ifdef HPC_TRAIN_TEST_ON_GPU
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include "comm/comm_backend.h"  // src/, private: NcclAbort drives the backend directly
#include "hpc_train/train/step_graph.h"
#endif

using hpc_train::Communicator;
using hpc_train::ReduceOp;
using namespace std::string_literals;

namespace {

constexpr double kStallTimeoutS = 2.0;
// A rank's stand-in for being stuck elsewhere; the watchdog ends the job long before.
constexpr auto kElsewhere = std::chrono::seconds(60);

// For test_comm_timeout.sh, which measures from here to the end of the job (start-up time on a
// loaded machine is no part of what the watchdog promises).
void announce_stall() {
  const auto since_epoch = std::chrono::system_clock::now().time_since_epoch();
  std::printf("stall begins at %lld ms\n", static_cast<long long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch).count()));
  std::fflush(stdout);
}

}  // namespace

#ifndef HPC_TRAIN_TEST_ON_GPU

namespace {

// Long enough never to fire in a passing run, even on an oversubscribed CI machine.
constexpr double kGenerousTimeoutS = 120.0;

// The parameter is the timeout in seconds (0 = no watchdog).
class CommunicatorTest : public ::testing::TestWithParam<double> {
 protected:
  CommunicatorTest() { comm.set_timeout(GetParam()); }
  Communicator comm{MPI_COMM_WORLD};
};

INSTANTIATE_TEST_SUITE_P(Watchdog, CommunicatorTest, ::testing::Values(0.0, kGenerousTimeoutS),
                         [](const auto& info) { return std::string(info.param > 0 ? "on" : "off"); });

}  // namespace

TEST_P(CommunicatorTest, AllReduceSumsRankValues) {
  const int n = comm.size();
  at::Tensor t = at::arange(7, at::kFloat) + comm.rank();
  comm.all_reduce(t).wait();
  // sum over r of (i + r) = n*i + n(n-1)/2
  const at::Tensor expected = at::arange(7, at::kFloat) * n + n * (n - 1) / 2.0;
  EXPECT_TRUE(at::equal(t, expected));
}

TEST_P(CommunicatorTest, AllReduceMaxAndInt64) {
  at::Tensor t = at::full({3}, comm.rank(), at::kLong);
  comm.all_reduce(t, ReduceOp::kMax, "max of ranks").wait();
  EXPECT_EQ(t[2].item<int64_t>(), comm.size() - 1);
}

TEST_P(CommunicatorTest, AsyncWorkCanBeTested) {
  at::Tensor t = at::ones({1000}, at::kDouble);
  hpc_train::Work work = comm.all_reduce(t, ReduceOp::kSum, "bucket 0");
  while (!work.test()) {
  }
  EXPECT_DOUBLE_EQ(t.sum().item<double>(), 1000.0 * comm.size());
}

TEST_P(CommunicatorTest, BroadcastFromRoot) {
  const int root = comm.size() - 1;
  at::Tensor t = at::full({5}, comm.rank() == root ? 42.0f : -1.0f);
  comm.broadcast(t, root, "initial parameters").wait();
  EXPECT_TRUE(at::equal(t, at::full({5}, 42.0f)));
}

TEST_P(CommunicatorTest, ReduceScatterThenAllGather) {
  const int n = comm.size();
  // Slice s of rank r holds r + s; reduced, slice s is sum_r (r + s) = n(n-1)/2 + n*s.
  const at::Tensor input = (at::arange(n, at::kFloat) + comm.rank()).repeat_interleave(4);
  at::Tensor slice = at::zeros({4});
  comm.reduce_scatter(input, slice, ReduceOp::kSum, "bucket 2").wait();
  EXPECT_TRUE(at::equal(slice, at::full({4}, n * (n - 1) / 2.0f + n * comm.rank())));
  at::Tensor gathered = at::zeros({4 * n});
  gathered.narrow(0, 4 * comm.rank(), 4).copy_(slice);
  comm.all_gather_in_place(gathered, "parameters bucket 2").wait();
  EXPECT_TRUE(at::equal(gathered, (at::arange(n, at::kFloat) * n + n * (n - 1) / 2.0f)
                                      .repeat_interleave(4)));
}

TEST_P(CommunicatorTest, ReduceScatterInPlace) {
  // The output is this rank's own slice of the input (as the reducer does with one rank).
  const int n = comm.size();
  at::Tensor input = (at::arange(n, at::kFloat) + comm.rank()).repeat_interleave(4);
  at::Tensor own = input.narrow(0, 4 * comm.rank(), 4);
  comm.reduce_scatter(input, own, ReduceOp::kSum, "bucket 0").wait();
  EXPECT_TRUE(at::equal(own, at::full({4}, n * (n - 1) / 2.0f + n * comm.rank())));
}

TEST_P(CommunicatorTest, Scalars) {
  EXPECT_DOUBLE_EQ(comm.all_reduce_scalar(0.5), 0.5 * comm.size());
  EXPECT_EQ(comm.all_reduce_count(comm.rank(), ReduceOp::kMin, "agreement"), 0);
}

TEST_P(CommunicatorTest, AllReduceDoublesElementWise) {
  const int r = comm.rank(), n = comm.size();
  // Element-wise over r: sum of r is n(n-1)/2, of -2r is -n(n-1), of 0.5 is n/2.
  std::vector<double> sums = {static_cast<double>(r), -2.0 * r, 0.5};
  comm.all_reduce_doubles(sums, ReduceOp::kSum, "GPU figures");
  EXPECT_EQ(sums, (std::vector<double>{n * (n - 1) / 2.0, -1.0 * n * (n - 1), 0.5 * n}));
  std::vector<double> maxima = {static_cast<double>(r), -2.0 * r, 0.5};
  comm.all_reduce_doubles(maxima, ReduceOp::kMax);
  EXPECT_EQ(maxima, (std::vector<double>{n - 1.0, 0.0, 0.5}));
  std::vector<double> none;
  comm.all_reduce_doubles(none, ReduceOp::kMin, "nothing");
  EXPECT_TRUE(none.empty());
}

TEST_P(CommunicatorTest, GatherCountInRankOrderAtRoot) {
  const int n = comm.size();
  for (int root = 0; root < n; ++root) {
    const std::vector<int64_t> values =
        comm.gather_count(10 * comm.rank() + root, root, "peak allocated bytes");
    if (comm.rank() != root) {
      EXPECT_TRUE(values.empty());
      continue;
    }
    ASSERT_EQ(values.size(), static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) EXPECT_EQ(values[i], 10 * i + root);
  }
}

TEST_P(CommunicatorTest, BroadcastStringFromRoot) {
  const int root = comm.size() - 1;
  // The others pass a longer string of their own, which must not survive; an embedded NUL does.
  const std::string rooted = "runs/a\0b/step-"s + std::to_string(root);
  const std::string mine = comm.rank() == root ? rooted : std::string(40, 'x');
  EXPECT_EQ(comm.broadcast_string(mine, root, "checkpoint to resume"), rooted);
  EXPECT_EQ(comm.broadcast_string(comm.rank() == 0 ? "" : "not rank 0's", 0), "");
}

TEST_P(CommunicatorTest, ManyOperationsInFlight) {
  std::vector<at::Tensor> buckets;
  std::vector<hpc_train::Work> works;
  for (int b = 0; b < 20; ++b) {
    buckets.push_back(at::full({100}, static_cast<float>(b)));
    works.push_back(comm.all_reduce(buckets.back(), ReduceOp::kSum, "bucket " + std::to_string(b)));
  }
  for (auto& work : works) work.wait();
  for (int b = 0; b < 20; ++b)
    EXPECT_FLOAT_EQ(buckets[b][99].item<float>(), static_cast<float>(b) * comm.size());
}

TEST_P(CommunicatorTest, RejectsNonContiguous) {
  at::Tensor t = at::zeros({4, 4}).t();
  EXPECT_THROW(comm.all_reduce(t), hpc_train::Error);
}

// A build without CUDA has no NCCL (comm_cpu.cpp stands in for comm_nccl.cpp): asking for it
// is a configuration error that says why.
TEST(CommunicatorBackend, NcclNeedsABuildWithCuda) {
  if (hpc_train::nccl_available()) GTEST_SKIP() << "this build has NCCL";
  try {
    Communicator comm(MPI_COMM_WORLD, hpc_train::CommBackendKind::kNccl, /*cuda_device=*/0);
    ADD_FAILURE() << "a Communicator with NCCL in a build without CUDA";
  } catch (const hpc_train::ConfigError& e) {
    EXPECT_STREQ(e.what(), "--backend nccl: this hpc_train was built with a LibTorch without CUDA");
  }
}

TEST(CommunicatorTimeout, IsSetAndTurnedOff) {
  Communicator comm(MPI_COMM_WORLD);
  EXPECT_EQ(comm.timeout_s(), 0.0);
  comm.set_timeout(2.5);
  EXPECT_EQ(comm.timeout_s(), 2.5);
  comm.set_timeout(0);
  EXPECT_EQ(comm.timeout_s(), 0.0);
  EXPECT_THROW(comm.set_timeout(-1), hpc_train::ConfigError);
}

TEST(CommunicatorTimeout, OutlivesNothingItWatches) {
  // A Work may outlive the watchdog it was registered with (the timeout changed meanwhile).
  Communicator comm(MPI_COMM_WORLD);
  comm.set_timeout(kGenerousTimeoutS);
  at::Tensor t = at::ones({3});
  hpc_train::Work work = comm.all_reduce(t, ReduceOp::kSum, "bucket 0");
  comm.set_timeout(0);
  work.wait();
  EXPECT_FLOAT_EQ(t[0].item<float>(), comm.size());
}

// Work launched elsewhere that holds the Communicator's collectives (a CUDA graph replay): its
// launch runs through launch_captured, and it is watched through watch() once a timeout is set.
TEST(CommunicatorTimeout, WatchesWorkLaunchedElsewhere) {
  Communicator comm(MPI_COMM_WORLD);
  bool launched = false;
  comm.launch_captured([&] { launched = true; });
  EXPECT_TRUE(launched);
  // Without a timeout nothing keeps it: it never finishes, and nothing happens.
  comm.watch(std::make_shared<hpc_train::WatchedOperation>("mpi", "graph replay", "step 1", 0));
  comm.set_timeout(0.5);
  auto replay = std::make_shared<hpc_train::WatchedOperation>("mpi", "graph replay", "step 2", 0);
  comm.watch(replay);
  replay->mark_finished();
  // Past the timeout: a finished operation must not end the job.
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  EXPECT_EQ(comm.all_reduce_count(1), comm.size());
}

// --- Stalls on purpose (test_comm_timeout.sh, 2 ranks): rank 1 never joins the collective
// that rank 0 starts. The watchdog must end the job within a few seconds of its 2 s timeout.

// Rank 0 waits for the collective (MpiWork's watched wait ends the job).
TEST(CommWatchdog, DISABLED_StalledWaitEndsTheJob) {
  Communicator comm(MPI_COMM_WORLD);
  comm.set_timeout(kStallTimeoutS);
  if (comm.rank() == 1) std::this_thread::sleep_for(kElsewhere);
  at::Tensor t = at::ones({7});
  announce_stall();
  comm.all_reduce(t, ReduceOp::kSum, "bucket 7").wait();
  ADD_FAILURE() << "the stalled collective finished";
}

// Rank 0 is busy elsewhere while its collective hangs (the watchdog's thread ends the job).
TEST(CommWatchdog, DISABLED_StalledWhileBusyEndsTheJob) {
  Communicator comm(MPI_COMM_WORLD);
  comm.set_timeout(kStallTimeoutS);
  if (comm.rank() == 1) std::this_thread::sleep_for(kElsewhere);
  const at::Tensor input = at::ones({8 * comm.size()});
  at::Tensor slice = at::zeros({8});
  announce_stall();
  hpc_train::Work work = comm.reduce_scatter(input, slice, ReduceOp::kSum, "bucket 8");
  std::this_thread::sleep_for(kElsewhere);
  ADD_FAILURE() << "the watchdog did not end the job";
}

// A blocking scalar reduction is watched too.
TEST(CommWatchdog, DISABLED_StalledScalarEndsTheJob) {
  Communicator comm(MPI_COMM_WORLD);
  comm.set_timeout(kStallTimeoutS);
  if (comm.rank() == 1) std::this_thread::sleep_for(kElsewhere);
  announce_stall();
  comm.all_reduce_scalar(1.0, ReduceOp::kSum, "loss");
  ADD_FAILURE() << "the stalled reduction finished";
}

// So is a blocking broadcast of host values; rank 1, the root, never sends.
TEST(CommWatchdog, DISABLED_StalledStringBroadcastEndsTheJob) {
  Communicator comm(MPI_COMM_WORLD);
  comm.set_timeout(kStallTimeoutS);
  if (comm.rank() == 1) std::this_thread::sleep_for(kElsewhere);
  announce_stall();
  comm.broadcast_string("", /*root=*/1, "checkpoint to resume");
  ADD_FAILURE() << "the stalled broadcast finished";
}

// Work launched elsewhere and registered with watch() (as a graph replay is) that never finishes
// (1 rank): the watchdog's thread ends the job, naming it.
TEST(CommWatchdog, DISABLED_StalledWatchedWorkEndsTheJob) {
  Communicator comm(MPI_COMM_WORLD);
  comm.set_timeout(kStallTimeoutS);
  announce_stall();
  comm.watch(std::make_shared<hpc_train::WatchedOperation>("mpi", "graph replay", "step 4", 0));
  std::this_thread::sleep_for(kElsewhere);
  ADD_FAILURE() << "the watchdog did not end the job";
}

#else  // HPC_TRAIN_TEST_ON_GPU: one rank, one GPU, the NCCL backend

namespace {

at::TensorOptions on_gpu() { return at::TensorOptions().device(at::kCUDA, 0); }

// Note [Graph capture]: with the watchdog on, a collective captured into a CUDA graph is not
// watched, test() does not query events while capturing, and the capture stays valid; `tell`:
// whether the caller says so with set_capturing (as the trainer does), or detection alone.
void capture_and_replay(bool tell) {
  Communicator comm(MPI_COMM_WORLD, hpc_train::CommBackendKind::kNccl, 0);
  comm.set_timeout(60.0);
  at::Tensor t = at::ones({1024}, on_gpu());
  hpc_train::Work eager = comm.all_reduce(t, ReduceOp::kSum, "before capture");
  eager.wait();
  const c10::cuda::CUDAStream capture_stream = c10::cuda::getStreamFromPool(false, 0);
  at::cuda::CUDAGraph graph;
  if (tell) comm.set_capturing(true);
  {
    c10::cuda::CUDAStreamGuard guard(capture_stream);
    graph.capture_begin();
    t.mul_(2);
    {
      hpc_train::Work captured = comm.all_reduce(t, ReduceOp::kSum, "captured bucket");
      EXPECT_FALSE(captured.test());
      EXPECT_FALSE(eager.test());  // no event query from a capturing thread
      captured.wait();
    }  // inside the capture: its destructor's wait joins the graph too
    graph.capture_end();
  }
  if (tell) comm.set_capturing(false);
  for (int replay = 0; replay < 3; ++replay) graph.replay();
  EXPECT_FLOAT_EQ(t[0].item<float>(), 8.0f);  // 2^3: every replay ran
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // watchdog rounds
  comm.all_reduce(t, ReduceOp::kSum, "after capture").wait();
  EXPECT_FLOAT_EQ(t[0].item<float>(), 8.0f);
}

}  // namespace

// Operations finish, their events are polled by the watchdog's thread, and nothing fires.
TEST(NcclWatchdog, QuietOnAHealthyRun) {
  Communicator comm(MPI_COMM_WORLD, hpc_train::CommBackendKind::kNccl, 0);
  comm.set_timeout(60.0);
  at::Tensor t = at::ones({1 << 20}, on_gpu());
  for (int b = 0; b < 50; ++b) comm.all_reduce(t, ReduceOp::kSum, "bucket " + std::to_string(b)).wait();
  EXPECT_FLOAT_EQ(t[0].item<float>(), 1.0f);  // one rank: a sum over one
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // a few watchdog rounds
  EXPECT_FLOAT_EQ(comm.all_reduce_scalar(1.5, ReduceOp::kSum, "loss"), 1.5);
}

TEST(NcclWatchdog, LeavesGraphCaptureAloneWhenTold) { capture_and_replay(/*tell=*/true); }
TEST(NcclWatchdog, LeavesGraphCaptureAloneByDetection) { capture_and_replay(/*tell=*/false); }

// A step captured with StepGraph and replayed through the Communicator: each replay is watched
// (Note [Communication watchdog]) and, once run, finished; past the timeout nothing fires.
TEST(NcclWatchdog, WatchedReplaysFinishQuietly) {
  hpc_train::TrainingStreamScope training_stream(/*cuda=*/true);
  Communicator comm(MPI_COMM_WORLD, hpc_train::CommBackendKind::kNccl, 0);
  comm.set_timeout(1.0);
  at::Tensor t = at::ones({1024}, on_gpu());
  comm.all_reduce(t, ReduceOp::kSum, "before capture").wait();
  hpc_train::StepGraph graph;
  std::string why;
  comm.set_capturing(true);
  const bool captured = graph.capture([&] {
    t.mul_(2);
    comm.all_reduce(t, ReduceOp::kSum, "captured bucket").wait();
  }, /*discard_step=*/[] {}, &why);
  comm.set_capturing(false);
  ASSERT_TRUE(captured) << why;
  for (int step = 1; step <= 5; ++step) graph.replay(comm, "step " + std::to_string(step));
  EXPECT_FLOAT_EQ(t[0].item<float>(), 32.0f);  // 2^5: every replay ran
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // watchdog rounds past 1 s
  comm.all_reduce(t, ReduceOp::kSum, "after replays").wait();
  EXPECT_FLOAT_EQ(t[0].item<float>(), 32.0f);
}

// Stalls on purpose (test_comm_timeout.sh with COMM_TIMEOUT_BACKEND=nccl): the caller's stream
// is held up on the host for longer than the timeout, so the collective queued behind it cannot
// finish in time, as if a peer never joined. The watchdog's thread must end the job.
TEST(NcclWatchdog, DISABLED_StalledNcclOperationEndsTheJob) {
  Communicator comm(MPI_COMM_WORLD, hpc_train::CommBackendKind::kNccl, 0);
  comm.set_timeout(kStallTimeoutS);
  at::Tensor t = at::ones({7}, on_gpu());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(0).stream();
  ASSERT_EQ(cudaLaunchHostFunc(stream, [](void*) { std::this_thread::sleep_for(kElsewhere); },
                               nullptr),
            cudaSuccess);
  announce_stall();
  comm.all_reduce(t, ReduceOp::kSum, "bucket 9").wait();
  std::this_thread::sleep_for(kElsewhere);
  ADD_FAILURE() << "the watchdog did not end the job";
}

// Note [Abort and launch] in comm_nccl.cpp: an abort (the watchdog's) while another thread
// launches collectives as fast as it can. Every launch either runs before the abort or throws the
// abort's reason; none uses the aborted communicator (which would crash, or fail inside NCCL
// with another message). Last in this file: the communicator it aborts is gone afterwards.
TEST(NcclAbort, LaunchesRacingAnAbortThrowItsReason) {
  std::unique_ptr<hpc_train::CommBackend> backend =
      hpc_train::make_nccl_backend(MPI_COMM_WORLD, /*cuda_device=*/0);
  at::Tensor t = at::ones({1 << 16}, on_gpu());
  backend->all_reduce(t, ReduceOp::kSum, "before the race").wait();
  std::atomic<int64_t> launched{0};
  std::atomic<bool> launcher_done{false};
  std::string thrown;  // the launcher's; read after join
  std::thread launcher([&] {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    try {
      while (std::chrono::steady_clock::now() < give_up) {
        backend->all_reduce(t, ReduceOp::kSum, "racing").wait();
        ++launched;
      }
    } catch (const hpc_train::Error& e) {
      thrown = e.what();
    }
    launcher_done = true;
  });
  while (launched.load() < 1000 && !launcher_done.load()) std::this_thread::yield();
  backend->abort("comm: test abort");
  launcher.join();
  EXPECT_EQ(thrown, "comm: test abort; the NCCL communicator was aborted");
  EXPECT_THROW(backend->all_reduce(t, ReduceOp::kSum, "after the abort"), hpc_train::Error);
  bool replayed = false;
  EXPECT_THROW(backend->launch_captured([&] { replayed = true; }), hpc_train::Error);
  EXPECT_FALSE(replayed);
}

#endif  // HPC_TRAIN_TEST_ON_GPU

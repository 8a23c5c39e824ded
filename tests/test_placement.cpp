// Placement (Note [Agreed placement] in placement.h). The decision is a pure function of every
// rank's report, so jobs this machine cannot host (GPUs per task, two nodes, ranks without GPUs)
// are tested with injected reports: node names, visible GPU counts and PCI bus ids. Then the
// collective resolve_placement at 1 and 3 ranks: every rank gathers the same reports and gets its
// own place, or every rank throws the same ConfigError.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "environment_set_aside.h"
#include "hpc_train/comm/comm.h"
#include "hpc_train/config/config.h"
#include "hpc_train/error.h"
#include "hpc_train/runtime/placement.h"
#include "hpc_train/runtime/runtime.h"
#include "mpi_world.h"

using hpc_train::CommBackendKind;
using hpc_train::ConfigError;
using hpc_train::decide_placement;
using hpc_train::Placement;
using hpc_train::RankDevices;
using hpc_train::TrainConfig;

namespace {

using test_support::world_rank;
using test_support::world_size;

// --device and --backend, by the names that the command line takes.
TrainConfig with(const std::string& device, const std::string& backend) {
  TrainConfig config;
  config.device = hpc_train::parse_choice<hpc_train::DeviceChoice>(device).value();
  config.backend = hpc_train::parse_choice<hpc_train::BackendChoice>(backend).value();
  return config;
}

std::string bus(int n) {
  char id[16];
  std::snprintf(id, sizeof(id), "0000:%02x:00.0", n);
  return id;
}

// `ranks` ranks on node `host` (local ranks 0..ranks-1), each seeing `gpus` GPUs: one of its own
// (per_task: every rank's only GPU is a different one) or the node's, shared (rank takes
// local_rank % gpus).
std::vector<RankDevices> node(const std::string& host, int ranks, int gpus, bool per_task) {
  std::vector<RankDevices> reports;
  for (int local = 0; local < ranks; ++local) {
    RankDevices r;
    r.host = host;
    r.local_rank = local;
    r.visible_gpus = gpus;
    if (gpus > 0) r.bus_id = per_task ? bus(0x10 + local) : bus(0x10 + local % gpus);
    reports.push_back(r);
  }
  return reports;
}

std::vector<RankDevices> join(std::vector<RankDevices> a, const std::vector<RankDevices>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The ConfigError's message; fails the test when there is none.
std::string refusal(const TrainConfig& config, const std::vector<RankDevices>& ranks,
                    bool nccl_built = true) {
  try {
    decide_placement(config, ranks, nccl_built);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError for --device " << hpc_train::to_string(config.device)
                << " --backend " << hpc_train::to_string(config.backend);
  return {};
}

void expect_everywhere(const std::vector<Placement>& placements, bool cuda, CommBackendKind backend,
                       const std::vector<int>& devices) {
  ASSERT_EQ(placements.size(), devices.size());
  for (size_t r = 0; r < placements.size(); ++r) {
    EXPECT_EQ(placements[r].cuda, cuda) << "rank " << r;
    EXPECT_STREQ(hpc_train::comm_backend_name(placements[r].backend),
                 hpc_train::comm_backend_name(backend))
        << "rank " << r;
    EXPECT_EQ(placements[r].cuda_device, devices[r]) << "rank " << r;
  }
}

}  // namespace

// srun --gpus-per-task=1: each of 4 ranks sees exactly one GPU, a different one, numbered 0 by
// CUDA in every rank. Four ranks and one visible GPU each is no reason for the MPI path.
TEST(DecidePlacement, OneGpuPerTaskUsesNccl) {
  const std::vector<RankDevices> ranks = node("a", 4, 1, /*per_task=*/true);
  expect_everywhere(decide_placement(with("auto", "auto"), ranks, true), true,
                    CommBackendKind::kNccl, {0, 0, 0, 0});
  expect_everywhere(decide_placement(with("auto", "nccl"), ranks, true), true,
                    CommBackendKind::kNccl, {0, 0, 0, 0});
  expect_everywhere(decide_placement(with("cuda", "nccl"), ranks, true), true,
                    CommBackendKind::kNccl, {0, 0, 0, 0});
}

// mpirun on a node with 4 GPUs visible to every rank: local rank r takes GPU r.
TEST(DecidePlacement, SharedVisibilityOneGpuEachUsesNccl) {
  const std::vector<RankDevices> ranks = node("a", 4, 4, /*per_task=*/false);
  expect_everywhere(decide_placement(with("auto", "auto"), ranks, true), true,
                    CommBackendKind::kNccl, {0, 1, 2, 3});
  expect_everywhere(decide_placement(with("auto", "nccl"), ranks, true), true,
                    CommBackendKind::kNccl, {0, 1, 2, 3});
}

// More ranks than GPUs: ranks share, auto stages through MPI, nccl is refused naming who shares.
TEST(DecidePlacement, SharedGpusFallBackToMpiAndRefuseNccl) {
  const std::vector<RankDevices> one_gpu = node("a", 3, 1, /*per_task=*/false);
  expect_everywhere(decide_placement(with("auto", "auto"), one_gpu, true), true,
                    CommBackendKind::kMpi, {0, 0, 0});
  EXPECT_EQ(refusal(with("auto", "nccl"), one_gpu),
            "--backend nccl needs a GPU of its own for every rank: ranks 0-2 (node a) share GPU "
            "0000:10:00.0; use --backend mpi, or one GPU per rank (e.g. srun --gpus-per-task=1)");

  const std::vector<RankDevices> two_gpus = node("a", 4, 2, /*per_task=*/false);
  expect_everywhere(decide_placement(with("auto", "auto"), two_gpus, true), true,
                    CommBackendKind::kMpi, {0, 1, 0, 1});
  const std::string message = refusal(with("cuda", "nccl"), two_gpus);
  EXPECT_NE(message.find("ranks 0,2 (node a) share GPU 0000:10:00.0, ranks 1,3 (node a) share GPU "
                         "0000:11:00.0"),
            std::string::npos)
      << message;
}

// One rank sharing among ranks with GPUs of their own is enough to keep NCCL away.
TEST(DecidePlacement, OnePairSharingIsEnoughForMpi) {
  std::vector<RankDevices> ranks = node("a", 4, 1, /*per_task=*/true);
  ranks[3].bus_id = ranks[1].bus_id;  // ranks 1 and 3 were given the same GPU
  expect_everywhere(decide_placement(with("auto", "auto"), ranks, true), true,
                    CommBackendKind::kMpi, {0, 0, 0, 0});
  EXPECT_NE(refusal(with("auto", "nccl"), ranks).find("ranks 1,3 (node a) share GPU 0000:11:00.0"),
            std::string::npos);
}

// Two nodes whose GPUs have the same bus ids: a GPU is named by its node and its bus id.
TEST(DecidePlacement, TwoNodesWithTheSameBusIds) {
  const std::vector<RankDevices> per_task = join(node("a", 2, 1, true), node("b", 2, 1, true));
  expect_everywhere(decide_placement(with("auto", "auto"), per_task, true), true,
                    CommBackendKind::kNccl, {0, 0, 0, 0});
  const std::vector<RankDevices> shared = join(node("a", 2, 2, false), node("b", 2, 2, false));
  expect_everywhere(decide_placement(with("auto", "nccl"), shared, true), true,
                    CommBackendKind::kNccl, {0, 1, 0, 1});
  // Node b has more ranks than GPUs: the whole job takes MPI, not only node b.
  const std::vector<RankDevices> crowded = join(node("a", 2, 2, false), node("b", 3, 2, false));
  expect_everywhere(decide_placement(with("auto", "auto"), crowded, true), true,
                    CommBackendKind::kMpi, {0, 1, 0, 1, 0});
  EXPECT_NE(
      refusal(with("auto", "nccl"), crowded).find("ranks 2,4 (node b) share GPU 0000:10:00.0"),
      std::string::npos);
}

// Some ranks see a GPU, some do not: no placement is agreed, and the message names both sides.
TEST(DecidePlacement, MixedGpuAndCpuRanksAreRefused) {
  // Ranks 0 and 2 on node a with a GPU each, rank 1 on node b without.
  std::vector<RankDevices> ranks = {node("a", 1, 1, true)[0], node("b", 1, 0, false)[0],
                                    node("a", 2, 1, true)[1]};
  const std::string both_sides = "ranks 0,2 (node a) see a GPU, rank 1 (node b) sees none";
  for (const char* backend : {"auto", "mpi", "nccl", "none"}) {
    EXPECT_EQ(refusal(with("auto", backend), ranks),
              "--device auto: " + both_sides +
                  "; make a GPU visible to every rank, or use --device cpu")
        << backend;
    EXPECT_NE(refusal(with("cuda", backend), ranks).find("--device cuda: " + both_sides),
              std::string::npos)
        << backend;
  }
  // --device cpu asks nothing of the GPUs.
  expect_everywhere(decide_placement(with("cpu", "auto"), ranks, true), false,
                    CommBackendKind::kMpi, {0, 0, 0});
}

// Both sides spread over several nodes, in ranges.
TEST(DecidePlacement, MixedSidesOverManyNodes) {
  const std::vector<RankDevices> ranks =
      join(join(node("a", 4, 1, true), node("b", 2, 0, false)), node("c", 3, 1, true));
  EXPECT_NE(refusal(with("auto", "auto"), ranks)
                .find("ranks 0-3 (node a), 6-8 (node c) see a GPU, ranks 4,5 (node b) see none"),
            std::string::npos);
}

TEST(DecidePlacement, DeviceCudaWithoutAnyGpu) {
  const std::vector<RankDevices> ranks = node("a", 3, 0, false);
  EXPECT_EQ(refusal(with("cuda", "auto"), ranks),
            "--device cuda: ranks 0-2 (node a) see no GPU (LibTorch sees none, or this hpc_train "
            "was built without CUDA); use --device cpu");
  EXPECT_NE(
      refusal(with("cuda", "mpi"), node("a", 1, 0, false)).find("rank 0 (node a) sees no GPU"),
      std::string::npos);
  // auto without GPUs anywhere is the CPU and MPI; nccl cannot run there.
  expect_everywhere(decide_placement(with("auto", "auto"), ranks, true), false,
                    CommBackendKind::kMpi, {0, 0, 0});
  EXPECT_EQ(refusal(with("auto", "nccl"), ranks),
            "--backend nccl needs a GPU of its own for every rank, and the ranks run on the CPU "
            "(--device auto); use --backend mpi");
}

TEST(DecidePlacement, DeviceCpuWithGpusVisible) {
  const std::vector<RankDevices> ranks = node("a", 2, 2, false);
  expect_everywhere(decide_placement(with("cpu", "auto"), ranks, true), false,
                    CommBackendKind::kMpi, {0, 0});
  EXPECT_NE(refusal(with("cpu", "nccl"), ranks).find("run on the CPU (--device cpu)"),
            std::string::npos);
}

// A build without NCCL: auto stays on MPI, nccl is refused whatever the GPUs.
TEST(DecidePlacement, BuildWithoutNccl) {
  const std::vector<RankDevices> ranks = node("a", 2, 1, /*per_task=*/true);
  expect_everywhere(decide_placement(with("auto", "auto"), ranks, /*nccl_built=*/false), true,
                    CommBackendKind::kMpi, {0, 0});
  EXPECT_EQ(refusal(with("auto", "nccl"), ranks, /*nccl_built=*/false),
            "--backend nccl: this hpc_train was built with a LibTorch without CUDA");
}

// A job of one rank has no one to exchange with: auto is none on a GPU and on the CPU, with or
// without NCCL; asked for, nccl and mpi still run a world of one.
TEST(DecidePlacement, OneRankAutoIsNone) {
  for (const bool nccl_built : {true, false}) {
    expect_everywhere(decide_placement(with("auto", "auto"), node("a", 1, 1, true), nccl_built),
                      true, CommBackendKind::kNone, {0});
    expect_everywhere(decide_placement(with("cpu", "auto"), node("a", 1, 1, true), nccl_built),
                      false, CommBackendKind::kNone, {0});
    expect_everywhere(decide_placement(with("auto", "auto"), node("a", 1, 0, false), nccl_built),
                      false, CommBackendKind::kNone, {0});
  }
  expect_everywhere(decide_placement(with("auto", "nccl"), node("a", 1, 1, true), true), true,
                    CommBackendKind::kNccl, {0});
  expect_everywhere(decide_placement(with("auto", "mpi"), node("a", 1, 1, true), true), true,
                    CommBackendKind::kMpi, {0});
}

// --backend none keeps the device's choice; the Communicator insists on one rank.
TEST(DecidePlacement, BackendNoneAndMpi) {
  expect_everywhere(decide_placement(with("auto", "none"), node("a", 1, 1, true), true), true,
                    CommBackendKind::kNone, {0});
  expect_everywhere(decide_placement(with("auto", "none"), node("a", 1, 0, false), true), false,
                    CommBackendKind::kNone, {0});
  expect_everywhere(decide_placement(with("auto", "mpi"), node("a", 2, 2, false), true), true,
                    CommBackendKind::kMpi, {0, 1});
}

TEST(Placement, Describes) {
  Placement p;
  EXPECT_EQ(p.describe(), "CPU, mpi");
  p.cuda = true;
  p.cuda_device = 1;
  p.backend = CommBackendKind::kNccl;
  EXPECT_EQ(p.describe(), "GPU 1, nccl");
  p.cuda = false;
  p.backend = CommBackendKind::kNone;
  EXPECT_EQ(p.describe(), "CPU, no communication");
}

TEST(Placement, MpiThreadLevel) {
  // Note [MPI thread level]: the GPU's MPI backend needs MPI_THREAD_SERIALIZED, the rest
  // MPI_THREAD_FUNNELED.
  Placement gpu_mpi;
  gpu_mpi.cuda = true;
  gpu_mpi.backend = CommBackendKind::kMpi;
  try {
    hpc_train::check_mpi_thread_level(gpu_mpi, MPI_THREAD_FUNNELED);
    ADD_FAILURE() << "MPI_THREAD_FUNNELED accepted for the MPI backend on a GPU";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("MPI granted MPI_THREAD_FUNNELED"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("needs MPI_THREAD_SERIALIZED"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(hpc_train::check_mpi_thread_level(gpu_mpi, MPI_THREAD_SERIALIZED));
  Placement gpu_nccl = gpu_mpi;
  gpu_nccl.backend = CommBackendKind::kNccl;
  EXPECT_NO_THROW(hpc_train::check_mpi_thread_level(gpu_nccl, MPI_THREAD_FUNNELED));
  const Placement cpu;  // CPU, mpi
  EXPECT_NO_THROW(hpc_train::check_mpi_thread_level(cpu, MPI_THREAD_FUNNELED));
  EXPECT_THROW(hpc_train::check_mpi_thread_level(cpu, MPI_THREAD_SINGLE), ConfigError);
}

TEST(Placement, ChoosesTheDevice) {
  EXPECT_EQ(hpc_train::choose_cuda_device(0, 1), 0);
  EXPECT_EQ(hpc_train::choose_cuda_device(3, 1), 0);  // its only GPU
  EXPECT_EQ(hpc_train::choose_cuda_device(3, 2), 1);
  EXPECT_EQ(hpc_train::choose_cuda_device(5, 8), 5);
}

// --- Over MPI, at 1 and 3 ranks: rank r plays local rank r % 2 of node "n<r / 2>".

namespace {

RankDevices report(int gpus, const std::string& bus_id) {
  RankDevices mine;
  mine.host = "n" + std::to_string(world_rank() / 2);
  mine.local_rank = world_rank() % 2;
  mine.visible_gpus = gpus;
  mine.bus_id = bus_id;
  return mine;
}

}  // namespace

TEST(ResolvePlacement, EveryRankWithAGpuOfItsOwn) {
  const Placement p = hpc_train::resolve_placement(with("auto", "auto"), MPI_COMM_WORLD,
                                                   report(1, bus(0x20 + world_rank())), true);
  EXPECT_TRUE(p.cuda);
  EXPECT_EQ(p.cuda_device, 0);
  EXPECT_EQ(p.backend, world_size() >= 2 ? CommBackendKind::kNccl : CommBackendKind::kNone);
}

// Each node has one GPU, of bus 0x20: ranks 0 and 1 (node n0) share theirs, rank 2 (node n1)
// has its own; the whole job takes MPI.
TEST(ResolvePlacement, RanksSharingAGpuAgreeOnMpi) {
  const Placement p = hpc_train::resolve_placement(with("auto", "auto"), MPI_COMM_WORLD,
                                                   report(1, bus(0x20)), true);
  EXPECT_TRUE(p.cuda);
  EXPECT_EQ(p.cuda_device, 0);
  EXPECT_EQ(p.backend, world_size() >= 2 ? CommBackendKind::kMpi : CommBackendKind::kNone);
}

// The last rank sees no GPU: with more than one rank, every rank throws the same ConfigError.
TEST(ResolvePlacement, MixedRanksAllRefuseAlike) {
  const bool last = world_rank() == world_size() - 1;
  const RankDevices mine = last ? report(0, "") : report(1, bus(0x30 + world_rank()));
  if (world_size() == 1) {
    const Placement p =
        hpc_train::resolve_placement(with("auto", "auto"), MPI_COMM_WORLD, mine, true);
    EXPECT_FALSE(p.cuda);
    EXPECT_EQ(p.backend, CommBackendKind::kNone);
    return;
  }
  ASSERT_EQ(world_size(), 3) << "written for 1 and 3 ranks";
  try {
    hpc_train::resolve_placement(with("auto", "auto"), MPI_COMM_WORLD, mine, true);
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "--device auto: ranks 0,1 (node n0) see a GPU, rank 2 (node n1) sees none; make a "
              "GPU visible to every rank, or use --device cpu");
  }
}

// This build's own report. A CPU build sees no GPU, and so runs on the CPU with MPI (none for
// one rank).
TEST(ResolvePlacement, ThisBuildsReport) {
  const RankDevices mine = hpc_train::probe_devices("here", world_rank());
  EXPECT_EQ(mine.host, "here");
  EXPECT_EQ(mine.local_rank, world_rank());
  EXPECT_EQ(mine.visible_gpus == 0, mine.bus_id.empty());
  if (hpc_train::nccl_available()) return;  // a GPU build: whatever this machine has
  EXPECT_EQ(mine.visible_gpus, 0);
  const Placement p = hpc_train::resolve_placement(with("auto", "auto"), MPI_COMM_WORLD, mine);
  EXPECT_FALSE(p.cuda);
  EXPECT_EQ(p.backend, world_size() >= 2 ? CommBackendKind::kMpi : CommBackendKind::kNone);
}

// Note [Early CUDA start]: where each launcher says a rank's place on its node, before MPI.
// The process's own variables (this test runs under mpirun) are set aside and put back.
TEST(LauncherLocalRank, EachLaunchersVariableAndNoLauncher) {
  const std::vector<std::string> names = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                          "PALS_LOCAL_RANKID", "SLURM_LOCALID",
                                          "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
  const hpc_train::testing::EnvironmentSetAside set_aside(names);

  EXPECT_EQ(hpc_train::launcher_local_rank(), 0) << "no launcher: the node's only rank";
  setenv("PMIX_RANK", "5", 1);
  EXPECT_EQ(hpc_train::launcher_local_rank(), std::nullopt)
      << "a launcher that does not say the local rank";
  setenv("SLURM_LOCALID", "3", 1);
  EXPECT_EQ(hpc_train::launcher_local_rank(), 3);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  EXPECT_EQ(hpc_train::launcher_local_rank(), 1) << "mpirun inside a Slurm batch script";
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  setenv("MPI_LOCALRANKID", "2", 1);
  EXPECT_EQ(hpc_train::launcher_local_rank(), 2) << "MPICH's Hydra";
  setenv("MPI_LOCALRANKID", "x2", 1);
  EXPECT_EQ(hpc_train::launcher_local_rank(), std::nullopt) << "not a number: no guess";

}

// Note [Single-node MPI transport]: what the launcher says of the job's nodes, and OMPI_MCA_pml
// set to ob1 only for one node and only where the environment chose no pml.
TEST(LauncherOneNode, OpenMpisSizesAloneAndOtherLaunchers) {
  const std::vector<std::string> names = {
      "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
      "MPI_LOCALRANKID",      "PALS_LOCAL_RANKID",          "SLURM_LOCALID",
      "OMPI_COMM_WORLD_RANK", "PMIX_RANK",                  "PMI_RANK",
      "OMPI_MCA_pml"};
  const hpc_train::testing::EnvironmentSetAside set_aside(names);
  const auto pml = [] {
    const char* value = std::getenv("OMPI_MCA_pml");
    return std::string(value ? value : "(unset)");
  };

  EXPECT_EQ(hpc_train::launcher_one_node(), true) << "started alone";
  hpc_train::prefer_single_node_transport(hpc_train::launcher_one_node());
  EXPECT_EQ(pml(), "ob1");
  setenv("OMPI_MCA_pml", "ucx", 1);  // mpirun --mca pml ucx, or the user's environment
  hpc_train::prefer_single_node_transport(true);
  EXPECT_EQ(pml(), "ucx") << "a chosen pml stays";
  unsetenv("OMPI_MCA_pml");

  setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "3", 1);
  EXPECT_EQ(hpc_train::launcher_one_node(), true) << "mpirun -np 3 on one node";
  setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
  EXPECT_EQ(hpc_train::launcher_one_node(), false) << "two nodes of four";
  hpc_train::prefer_single_node_transport(hpc_train::launcher_one_node());
  EXPECT_EQ(pml(), "(unset)") << "across nodes the site's pml stands";
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "four", 1);
  EXPECT_EQ(hpc_train::launcher_one_node(), std::nullopt) << "not a number: no guess";
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                           "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"})
    unsetenv(name);
  setenv("PMIX_RANK", "1", 1);  // srun's direct launch: it does not say here
  setenv("SLURM_LOCALID", "1", 1);
  EXPECT_EQ(hpc_train::launcher_one_node(), std::nullopt);
  hpc_train::prefer_single_node_transport(hpc_train::launcher_one_node());
  EXPECT_EQ(pml(), "(unset)");

}

// Note [Open MPI's default core binding] (cpu_binding.h): which environments say that mpirun
// bound a rank by its default, the share rule, and the undoing in this very process, which CTest
// starts under mpirun (one rank: bound to one core by Open MPI 4's default; two ranks on a
// two-core machine: a core each, their share, which stays).
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "environment_set_aside.h"
#include "hpc_train/runtime/cpu_binding.h"

namespace {

using hpc_train::below_cpu_share;
using hpc_train::bound_by_open_mpi_default;
using hpc_train::open_mpi_binding_choices;

// The variables the rule reads, set aside for a test and put back after it.
std::vector<std::string> binding_variables() {
  std::vector<std::string> names = {"OMPI_MCA_orte_bound_at_launch"};
  for (const char* const* choice = open_mpi_binding_choices; *choice; ++choice)
    names.push_back(*choice);
  return names;
}

TEST(BoundByOpenMpiDefault, MarkedBoundWithNoChoiceOnly) {
  const hpc_train::testing::EnvironmentSetAside set_aside(binding_variables());
  EXPECT_FALSE(bound_by_open_mpi_default()) << "no mark: another launcher, or none";
  setenv("OMPI_MCA_orte_bound_at_launch", "0", 1);
  EXPECT_FALSE(bound_by_open_mpi_default());
  setenv("OMPI_MCA_orte_bound_at_launch", "1", 1);
  EXPECT_TRUE(bound_by_open_mpi_default()) << "plain mpirun -np 1";
  for (const char* const* choice = open_mpi_binding_choices; *choice; ++choice) {
    setenv(*choice, "core", 1);
    EXPECT_FALSE(bound_by_open_mpi_default()) << *choice << " chose the binding";
    unsetenv(*choice);
  }
  EXPECT_TRUE(bound_by_open_mpi_default());
}

TEST(BelowCpuShare, FewerThanTheNodesCpusOverItsRanks) {
  EXPECT_TRUE(below_cpu_share(1, 16, 1)) << "mpirun -np 1 on 16 cores";
  EXPECT_TRUE(below_cpu_share(1, 16, 2)) << "mpirun -np 2 on 16 cores";
  EXPECT_FALSE(below_cpu_share(1, 2, 2)) << "two ranks, a core each of two";
  EXPECT_FALSE(below_cpu_share(8, 16, 2)) << "a socket of two";
  EXPECT_FALSE(below_cpu_share(1, 1, 1)) << "one CPU in all";
  EXPECT_TRUE(below_cpu_share(1, 2, 0)) << "no local size said: one rank";
}

int cpu_count(pid_t pid) {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  EXPECT_EQ(sched_getaffinity(pid, sizeof cpus, &cpus), 0);
  return CPU_COUNT(&cpus);
}

// mpirun, this process's parent, runs where the job may: an independent count of the CPUs the
// rank may take.
TEST(UndoDefaultCoreBinding, TakesTheLaunchersCpusBelowItsShareOnly) {
  if (!bound_by_open_mpi_default()) GTEST_SKIP() << "not bound by mpirun's default";
  const int bound = cpu_count(0), launcher = cpu_count(getppid());
  const char* local_size = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  ASSERT_NE(local_size, nullptr);
  const bool widens = below_cpu_share(bound, launcher, std::atoi(local_size));
  const std::string said = hpc_train::undo_default_core_binding();
  if (widens) {
    EXPECT_EQ(cpu_count(0), launcher) << said;
    EXPECT_NE(said.find(std::to_string(launcher) + " CPUs"), std::string::npos) << said;
  } else {
    EXPECT_EQ(cpu_count(0), bound);
    EXPECT_EQ(said, "");
  }
  std::printf("bound to %d CPU(s) of mpirun's %d, %s ranks: %s\n", bound, launcher, local_size,
              said.empty() ? "kept" : said.c_str());
}

}  // namespace

// Note [Open MPI's default core binding] (cpu_binding.h).
#include "hpc_train/runtime/cpu_binding.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <string>

namespace hpc_train {

const char* const open_mpi_binding_choices[] = {
    "OMPI_MCA_hwloc_base_binding_policy",  // --bind-to
    "OMPI_MCA_hwloc_base_cpu_list",        // --cpu-list
    "OMPI_MCA_hwloc_base_cpu_set",         // --cpu-set (before 4.0)
    "OMPI_MCA_rmaps_base_mapping_policy",  // --map-by, with :PE=n
    "OMPI_MCA_rmaps_base_cpus_per_rank",   // --cpus-per-rank
    "OMPI_MCA_rmaps_rank_file_path",       // --rankfile
    nullptr};

bool bound_by_open_mpi_default() {
  const char* bound = std::getenv("OMPI_MCA_orte_bound_at_launch");
  if (!bound || std::string(bound) != "1") return false;
  for (const char* const* choice = open_mpi_binding_choices; *choice; ++choice)
    if (std::getenv(*choice)) return false;
  return true;
}

bool below_cpu_share(int bound_cpus, int allowed_cpus, int local_ranks) {
  return static_cast<long>(bound_cpus) * std::max(1, local_ranks) < allowed_cpus;
}

namespace {

int local_ranks() {
  const char* local_size = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  return local_size ? std::max(1, std::atoi(local_size)) : 1;
}

}  // namespace

std::string undo_default_core_binding() {
  if (!bound_by_open_mpi_default()) return "";
  cpu_set_t bound;
  if (sched_getaffinity(0, sizeof bound, &bound) != 0) return "";
  // Asking for every CPU gets those the cgroup's cpuset allows: the kernel keeps the
  // intersection.
  cpu_set_t every;
  CPU_ZERO(&every);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) CPU_SET(cpu, &every);
  cpu_set_t allowed;
  if (sched_setaffinity(0, sizeof every, &every) != 0 ||
      sched_getaffinity(0, sizeof allowed, &allowed) != 0)
    return "";
  const int bound_count = CPU_COUNT(&bound), allowed_count = CPU_COUNT(&allowed);
  if (!below_cpu_share(bound_count, allowed_count, local_ranks())) {
    sched_setaffinity(0, sizeof bound, &bound);  // its share or more: the binding stays
    return "";
  }
  return "CPU binding: Open MPI's mpirun bound each rank to " + std::to_string(bound_count) +
         " CPU(s) by default; hpc_train's ranks run on the " + std::to_string(allowed_count) +
         " CPUs this process may use instead (mpirun's --bind-to or --map-by chooses a binding, "
         "which hpc_train keeps)";
}

}  // namespace hpc_train

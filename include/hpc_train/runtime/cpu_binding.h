// A rank's CPUs where Open MPI's mpirun chose them by its default rule.
//
// Note [Open MPI's default core binding]
// Open MPI 4's mpirun binds each rank of a job of one or two ranks to one core when nothing on
// its command line or in its environment chooses a binding (--bind-to, --map-by, --cpu-list, a
// rankfile), and from three ranks on to a socket. A rank of hpc_train runs several threads at
// once: the CUDA start beside MPI_Init (Note [Early CUDA start]), the twin's warm-up step beside
// the model's check (Note [Training step warm-up]), the resident splits' upload, the HDF5 loader,
// the checkpoint writer, and the training loop's launches beside LibTorch's autograd thread.
// Bound to one core they take turns: the origin's job (`mpirun -np 1`, bf16) took clearly longer
// bound than under `--bind-to none` or with the binding undone as below, its model phase most of
// all, its steps a little (bench/results-notes.md, Note [Open MPI's default core binding]).
// PyTorch's launchers (torchrun, deepspeed) bind nothing.
//
// So main() first, before any thread of ours exists (a thread inherits its creator's CPUs),
// undoes that default where it left the rank fewer CPUs than its share of those the process may
// use (the cgroup's cpuset: Slurm's allocation, a container's limit; shared by the node's ranks):
// the rank takes all of them, as `--bind-to none` gives it, and rank 0 says so in the log. The
// intra-op threads are then counted from the wider set (compute_threads_per_rank). The rule is
// Open MPI's default only: mpirun marks a rank it bound (OMPI_MCA_orte_bound_at_launch=1) and
// passes a binding or mapping the user chose as an MCA variable (open_mpi_binding_choices), so a
// chosen binding is kept, as is any other launcher's (srun's --cpu-bind), and Open MPI 5's
// (PRRTE), whose ranks carry neither variable. Open MPI's default socket binding (three ranks or
// more) is kept where a socket holds at least the rank's share (three ranks on one or two
// sockets); with more sockets than ranks a rank takes all of them as well.
#pragma once

#include <string>

namespace hpc_train {

// The MCA variables by which Open MPI 4's mpirun passes a chosen binding or mapping to its ranks
// (--bind-to, --cpu-list, --map-by including :PE=n, --cpus-per-rank, a rankfile), null-ended.
extern const char* const open_mpi_binding_choices[];

// Whether this rank's environment says that Open MPI's mpirun bound it by its default rule.
bool bound_by_open_mpi_default();

// Whether a rank bound to `bound_cpus` of the `allowed_cpus` its process may use, one of
// `local_ranks` ranks on its node, has fewer than its share of them.
bool below_cpu_share(int bound_cpus, int allowed_cpus, int local_ranks);

// Note [Open MPI's default core binding]: widens the calling thread's CPUs (and so those of every
// thread it starts later) where both tests above hold. Returns what it did, for the log ("" where
// it changed nothing).
std::string undo_default_core_binding();

}  // namespace hpc_train

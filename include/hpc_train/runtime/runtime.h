// The process's place in the job: MPI start-up and shut-down, world rank and size, the rank's
// place on its node, and how a failure on one rank ends every rank.
//
// Two ways an error ends the job (Note [Ending the job]):
//  - a *setup phase* in which no rank can fail while another waits in a collective (config,
//    placement, dataset open) runs through `run_agreed_phase`: the ranks agree by a collective
//    that something failed, rank 0 prints each distinct message once with the ranks that raised
//    it, and all ranks exit cleanly with the exception's exit code;
//  - anywhere else (the trainer's construction, which broadcasts the weights, and inside a
//    step: wherever other ranks may be waiting in a collective) the exception reaches
//    `run_or_abort`: the failing rank prints `[rank R@host] error: message` at once and calls
//    MPI_Abort, so that no rank waits forever (a rank in an agreement while the others wait in
//    a broadcast would leave the job to the watchdog, or to no one with --comm-timeout 0, and
//    its message unprinted). Ranks that fail alike print alike. On the way there the exception
//    unwinds the stack: destructors that would wait for other ranks (a pending collective, a
//    collective file close) skip that while std::uncaught_exceptions() > 0.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace hpc_train {

// Note [Single-node MPI transport]: Open MPI's MPI_Init picks its point-to-point layer (pml) by
// trying the candidates, and UCX's and libfabric's look for network devices, which made MPI_Init
// much slower, under mpirun and alone, than with ob1, Open MPI's own layer, which reaches the
// node's other ranks through shared memory
// (bench/results-notes.md, Note [Single-node MPI transport]). Across nodes the site's layer
// matters (UCX on InfiniBand, for the data store's exchange and the MPI backend's collectives);
// within one node ob1 is as direct. So where the launcher says every rank runs on this node
// (launcher_one_node in placement.h) and no pml was chosen in the environment (OMPI_MCA_pml, which
// `mpirun --mca pml X` also sets), OMPI_MCA_pml is set to ob1 before MPI_Init. Other MPI libraries
// ignore the variable.
// Sets OMPI_MCA_pml=ob1 when `one_node` is true and the environment chose no pml.
void prefer_single_node_transport(std::optional<bool> one_node);

class Runtime {
 public:
  // MPI_Init_thread asking for MPI_THREAD_MULTIPLE: the data prefetch thread may do MPI-IO
  // (parallel HDF5) while the main thread communicates. `one_node`: whether the launcher says
  // that every rank runs on this node (Note [Single-node MPI transport]).
  Runtime(int* argc, char*** argv, std::optional<bool> one_node = std::nullopt);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // Place among the ranks that share this node's memory (MPI_COMM_TYPE_SHARED): it chooses the
  // GPU and shares the CPU cores. Not SLURM_LOCALID, which is wrong under mpirun in an allocation.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  const std::string& hostname() const { return hostname_; }
  bool thread_multiple() const { return thread_level_ >= MPI_THREAD_MULTIPLE; }
  int thread_level() const { return thread_level_; }  // as MPI_Init_thread granted it
  MPI_Comm world() const { return MPI_COMM_WORLD; }
  // "rank R@host", the prefix of every message that names a rank.
  std::string rank_label() const;

 private:
  int rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  int thread_level_ = MPI_THREAD_SINGLE;
  std::string hostname_;
};

// Thrown by run_agreed_phase once a failure has been reported: every rank ends with `exit_code`
// and nothing more is printed.
struct JobEnded {
  int exit_code;
};

// Runs `phase` on every rank; see Note [Ending the job]. Collective over the world.
void run_agreed_phase(const Runtime& runtime, const std::function<void()>& phase);

// Runs the program body; an escaping exception ends the job (Note [Ending the job]).
int run_or_abort(const Runtime& runtime, const std::function<int()>& body);

// Intra-op threads for LibTorch on this rank: the cores this process may run on, shared with
// the other ranks of the node (at least 1). `requested` > 0 wins, up to the node's hardware
// threads (ConfigError above).
int compute_threads_per_rank(int local_size, int requested);

// This node's physical memory in bytes (what sysconf reports), for the checks that refuse, before
// anything is allocated, inputs that could never fit (dataset_file.h, validate_for_dataset).
int64_t physical_memory_bytes();

// `bytes` for messages, in the largest binary unit that keeps it at 1 or more, four
// significant digits: "784 B", "6.891 KiB", "23.43 GiB", "8 TiB".
std::string memory_text(double bytes);

// Whether this process's standard output reaches a terminal. Under Open MPI's mpirun a rank's
// stdout is always a pseudo-terminal, so there the question goes to mpirun's own stdout (a
// batch job's log file is no terminal even though isatty() says so).
bool stdout_is_terminal();

// Rank `root`'s string on every rank. Collective.
std::string broadcast_string(MPI_Comm comm, const std::string& value, int root);

}  // namespace hpc_train

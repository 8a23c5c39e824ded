// Where each rank computes and how the ranks communicate, agreed by every rank.
//
// Note [Agreed placement]
// Ranks that chose for themselves could disagree: a node without GPUs would pick the CPU and
// MPI while the others pick GPUs and NCCL, and the job would hang in its first collective. So
// each rank reports what it sees (RankDevices: its node, the GPUs visible to it, the PCI bus id
// of the one it would take), the reports are gathered on every rank (resolve_placement), and
// one pure function (decide_placement) turns them into every rank's placement. Every rank
// computes the same answer from the same reports: the same placement, or the same ConfigError,
// which names the ranks on each side of the disagreement.
//
// The rules (--device, --backend as in config.h):
//   device  cpu: the CPU everywhere. cuda: a GPU everywhere; ranks that see none are an error.
//           auto: a GPU everywhere if every rank sees one, the CPU if none does; a job where
//           some ranks see a GPU and some do not is an error (make GPUs visible to every rank,
//           or say --device cpu).
//   GPU     choose_cuda_device: a rank that sees one GPU (srun --gpus-per-task=1, or a
//           CUDA_VISIBLE_DEVICES of its own) takes it; ranks that share a node's GPUs take
//           local rank modulo the visible GPUs.
//   backend NCCL needs a GPU of its own for every rank: every rank's (node, bus id) distinct.
//           auto: none for a job of one rank (it has no one to exchange with, and an NCCL
//           world of one made start-up longer, its communicator phase most of all, and each
//           step a little slower: bench/results-notes.md, placement.h --backend auto); else
//           NCCL when that holds and this build has NCCL, else MPI (GPU tensors staged through
//           the host). nccl: refused otherwise, naming the ranks that share a GPU. mpi: MPI.
//           none: no communication (one rank; the Communicator checks).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <torch/types.h>

#include "hpc_train/comm/comm.h"
#include "hpc_train/config/config.h"

namespace hpc_train {

// Where this rank computes and how it communicates.
struct Placement {
  bool cuda = false;
  int cuda_device = 0;  // choose_cuda_device's answer (CUDA_VISIBLE_DEVICES applies)
  CommBackendKind backend = CommBackendKind::kMpi;
  // Every rank's node, as the log's header says it: "ranks 0 (node node1), 1 (node node2)".
  std::string ranks_by_node;
  std::string describe() const;  // e.g. "GPU 0, nccl"
};

// A GPU's memory, in bytes, as CUDA reports it (cudaMemGetInfo).
struct GpuMemory {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};

// The memory of the GPU `placement` runs on (making its CUDA context where there is none yet);
// nullopt where it runs on the CPU, as always in a CPU build.
std::optional<GpuMemory> gpu_memory(const Placement& placement);

// What one rank sees: the input of the decision (Note [Agreed placement]).
struct RankDevices {
  std::string host;      // the node's name
  int local_rank = 0;    // place among the ranks of the node (Runtime::local_rank)
  int visible_gpus = 0;  // GPUs this rank can use; 0 on a CPU build
  // PCI bus id ("0000:1b:00.0") of the GPU it would take (choose_cuda_device): what names one
  // GPU however CUDA_VISIBLE_DEVICES numbers it for each rank. Empty without GPUs.
  std::string bus_id;
};

// The GPU a rank takes among those it sees: local_rank % visible_gpus (its only GPU when it
// sees one). visible_gpus > 0.
int choose_cuda_device(int local_rank, int visible_gpus);

// Every rank's placement from every rank's report (`ranks[r]` is rank r's), by the rules of
// Note [Agreed placement]. `nccl_built`: whether this build has NCCL (nccl_available()). Pure.
// Throws ConfigError for what cannot work, naming the ranks and their nodes:
// "--device auto: ranks 0,2 (node a) see a GPU, rank 1 (node b) sees none; ...".
std::vector<Placement> decide_placement(const TrainConfig& config,
                                        const std::vector<RankDevices>& ranks, bool nccl_built);

// This rank's report: the GPUs LibTorch sees and the bus id of the one choose_cuda_device
// takes. A CPU build reports none (placement_cpu.cpp; the GPU build's is placement_cuda.cpp).
RankDevices probe_devices(const std::string& host, int local_rank);

// This rank's placement, agreed by every rank of `comm`: the reports are gathered on every
// rank (MPI_Allgather), and every rank decides from all of them alike (decide_placement), so
// every rank gets its place or every rank throws the same ConfigError. Collective. `mine` is
// made beforehand (probe_devices), so that a rank whose probe throws leaves no rank waiting here.
Placement resolve_placement(const TrainConfig& config, MPI_Comm comm, const RankDevices& mine,
                            bool nccl_built = nccl_available());

// Note [MPI thread level]
// Runtime asks MPI_Init_thread for MPI_THREAD_MULTIPLE; an MPI built without thread support
// grants less, and what a rank then needs depends on its placement. On the CPU every MPI call of
// the training comes from the main thread (autograd runs the gradient hooks, which start the
// bucket collectives, on the thread that called backward; the loader's MPI-IO and the
// watchdog's MPI calls are left out without MPI_THREAD_MULTIPLE): MPI_THREAD_FUNNELED will do.
// On a GPU with the MPI backend, autograd runs those hooks on its own device thread, while the
// main thread waits in backward and calls MPI before and after it (the step agreement's
// all-reduce, Note [Stop agreement]): MPI from two threads, never at once, which takes
// MPI_THREAD_SERIALIZED. NCCL's collectives are not MPI calls: the main thread's do with
// MPI_THREAD_FUNNELED. Throws ConfigError naming the level granted and the one needed when
// `granted` (MPI_Query_thread's answer) is below what `placement` needs.
void check_mpi_thread_level(const Placement& placement, int granted);

class Runtime;  // runtime.h

// This rank's placement for `config`, probed and resolved in two agreed phases (runtime.h: a
// rank whose probe fails must not leave the others waiting in resolve_placement's collective),
// with MPI's thread level checked against it (Note [MPI thread level]). Collective.
Placement agree_placement(const Runtime& runtime, const TrainConfig& config);

// Note [Early CUDA start]
// A GPU rank's CUDA context and LibTorch's first use of cuBLAS and cuDNN (most of the model phase)
// wait for nothing that MPI decides, yet they came after MPI_Init, the configuration, the placement
// and the dataset's checks. So main() starts them on a thread before MPI_Init, on the GPU the rank
// will most likely take: choose_cuda_device of the launcher's local rank (launcher_local_rank),
// which is what the agreed placement picks unless it decides on the CPU. The thread makes the
// context and runs a small convolution and matrix product, forward and backward, in the run's dtype
// (as the command line and INI file give it: a DeepSpeed config's precision, applied later, may
// differ) and NHWC: the libraries load and their handles are made there, and go back to LibTorch's
// per-device pools when the thread ends. main() waits for the thread only once the trainer is
// built, so that its loads run beside the trainer's own first uses (Note [Training step warm-up]:
// the driver loads on several threads at once) and the trainer's first CUDA call waits only for the
// context. Against a wait before the trainer, the origin's job ended a little sooner on average in
// each of two sets of six alternating runs, by less than the runs' own spread
// (bench/results-notes.md, Note [Early CUDA start]). The thread's convolution reads cuDNN's
// deterministic switch, which the trainer owns: the constructor sets it from the same command line
// before the thread starts. Nothing starts where the command line does not parse (the agreed phase
// reports that), asks for the CPU, or where the launcher does not say the rank's place on its node.
// Where the placement then differs (the CPU after all, or another GPU), the context stays unused on
// that GPU and the rank warns; LibTorch's handles on it are freed at exit.

// This process's rank as the launcher says it (mpirun, srun, a PMI/PMIx launcher), before MPI
// exists; 0 when started alone.
int launcher_rank();

// This process's place among its node's ranks as its launcher says it (Open MPI's mpirun,
// MPICH's Hydra, Cray PALS, Slurm's srun), before MPI exists; 0 for a process started without a
// launcher; nullopt under a launcher that does not say.
std::optional<int> launcher_local_rank();

// Whether the launcher says that every rank of the job runs on this node, before MPI exists:
// true for a process started without a launcher, and under Open MPI's mpirun when its local and
// world sizes agree (OMPI_COMM_WORLD_LOCAL_SIZE, OMPI_COMM_WORLD_SIZE); false when they differ;
// nullopt under a launcher that does not say (Note [Single-node MPI transport] in runtime.h).
std::optional<bool> launcher_one_node();

class EarlyCudaStart {
 public:
  // Starts the thread when this is a GPU build, `config` (the command line parsed before MPI;
  // null when it did not parse) allows a GPU, and launcher_local_rank() knows the rank's place.
  // `dtype`: the run's (model_dtype).
  EarlyCudaStart(const TrainConfig* config, torch::Dtype dtype);
  ~EarlyCudaStart();  // waits for the thread
  EarlyCudaStart(const EarlyCudaStart&) = delete;
  EarlyCudaStart& operator=(const EarlyCudaStart&) = delete;

  // Waits for the thread. Returns a warning when it started a GPU that `placement` does not
  // use, else "".
  std::string finish(const Placement& placement);

 private:
  std::thread thread_;
  int device_ = -1;  // the GPU the thread started, once it has ended; -1: none
};

}  // namespace hpc_train

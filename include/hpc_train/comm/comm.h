// The Communicator: collectives over the ranks of one MPI communicator, on tensors.
//
// Operations are asynchronous and return a `Work` handle (wait / test), so that a caller can
// start a reduction and do something else meanwhile. Two backends, chosen in one place
// (Communicator's constructor):
//   mpi   MPI's non-blocking collectives on host memory. GPU tensors are staged through pinned
//         host buffers (the MPI we target is not CUDA-aware): copied to the host when the
//         operation starts, and back when the Work completes. (comm_mpi.cpp)
//   nccl  NCCL on GPU tensors, on a communication stream of its own: an operation first waits
//         (on the GPU) for the work queued so far on the caller's stream, and Work::wait makes
//         the caller's stream wait for the operation; the host never blocks inside a step.
//         Built only when LibTorch has CUDA. (comm_nccl.cpp)
// Scalars and flags always go through MPI on the host.
//
// Every operation may carry a label saying what it is for ("bucket 3"), so that a watchdog can
// name the operation that stalled (Note [Communication watchdog]).
//
// This header is what callers use. The backends' interface (CommBackend, their factories) and
// the watchdog's machinery (CommWatchdog) are private to comm*.cpp: src/comm/comm_backend.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace hpc_train {

enum class ReduceOp { kSum, kMax, kMin };
// kNone: a world of one rank with nothing to communicate; every collective is complete at once
// (what a run with the distributed machinery switched off is measured with).
enum class CommBackendKind { kMpi, kNccl, kNone };

// The kind's name: "mpi", "nccl" or "none".
const char* comm_backend_name(CommBackendKind kind);
// Whether this build can run NCCL (LibTorch with CUDA).
bool nccl_available();

// A collective in flight. Non-copyable, movable; waits in its destructor if nobody did, so
// that a buffer is never released while a collective still writes to it (and never throws there).
class Work {
 public:
  class Impl;  // a backend's operation (comm_backend.h)

  Work();  // nothing to wait for (out of line: Impl is complete only in comm*.cpp)
  explicit Work(std::unique_ptr<Impl> impl);
  ~Work();
  Work(Work&&) noexcept;
  Work& operator=(Work&& other) noexcept;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  void wait();  // throws Error on failure
  bool test();

 private:
  std::unique_ptr<Impl> impl_;
};

// Note [Communication watchdog]
// A collective that never finishes (a rank died, skipped a collective or called them in another
// order) would otherwise hang every rank until the batch system kills the job, without a word
// about what hung. With a timeout set (Communicator::set_timeout), every operation is registered
// with the Communicator's watchdog when it starts: what it is (all_reduce, ...), its label, its
// bytes and its start time. So is each replay of a CUDA graph that holds a step's collectives,
// as one operation (Communicator::watch; "graph replay" of "step N", no bytes). An operation is
// finished when
//   mpi   its Work has observed completion (MPI_Wait/MPI_Test returned it), or the Work was
//         dropped unwaited (an exception unwinds: no one waits for it any more);
//   nccl  its "done" event has completed (cudaEventQuery from the watchdog's thread; the compute
//         stream is never synchronised);
//   graph replay  the event recorded after the replay on the training stream has completed
//         (queried likewise; step_graph_cuda.cpp).
// A thread polls every kWatchdogPollMs (comm_backend.h): an operation unfinished after the
// timeout, or an asynchronous NCCL error, ends the job: one line `[rank R@host] comm: <op> of
// <label> (<bytes> B) did not finish within <T> s (backend mpi|nccl|none)`, ncclCommAbort, then
// MPI_Abort, so that no rank hangs. Before that line is printed, every other rank is asked
// whether it still answers on the network, and those that do not are named in it (Note [Naming
// a lost peer], peer_probe.h). The thread calls MPI_Abort only where MPI granted
// MPI_THREAD_MULTIPLE; so that this does not matter for MPI operations, a watched MPI wait polls
// with MPI_Test and ends the job from the waiting thread itself once the operation is overdue.
// (Without MPI_THREAD_MULTIPLE, an NCCL failure aborts the NCCL communicator, and the next NCCL
// operation or graph replay throws Error; so does the next replay after any failure the thread
// reported.)
// The timeout counts from when the operation was issued, which for NCCL may be before the GPU
// reaches it; it is meant to be far longer than any step (default 300 s).
//
// Note [Graph capture]
// While a stream is captured into a CUDA graph, querying an event recorded in the capture is
// illegal, and from the capturing thread so is querying any event. So while the caller says it
// captures (Communicator::set_capturing), and whenever the NCCL backend sees for itself that the
// caller's stream is being captured (cudaStreamIsCapturing): operations are not registered with
// the watchdog (nothing is launched until the graph is replayed, so a timeout would mean
// nothing; each replay is watched instead, as one operation), Work::test() answers false for
// captured operations and whenever the calling thread captures, and the watchdog's thread
// pauses. That thread also uses the thread-local capture mode, so that its queries of earlier,
// uncaptured operations could not disturb a capture elsewhere anyway.
class CommBackend;
class CommWatchdog;
class PeerProbe;

// One operation as the watchdog sees it, shared by its Work and the watchdog (which keeps it
// until it has finished). Backends subclass it where the Work does not observe completion, and
// so do callers that register work of their own (Communicator::watch; a graph replay).
class WatchedOperation {
 public:
  using Clock = std::chrono::steady_clock;
  WatchedOperation(const char* backend, const char* name, std::string label, int64_t bytes)
      : backend_(backend), name_(name), label_(std::move(label)), bytes_(bytes) {}
  virtual ~WatchedOperation() = default;
  WatchedOperation(const WatchedOperation&) = delete;
  WatchedOperation& operator=(const WatchedOperation&) = delete;

  const char* backend() const { return backend_; }  // comm_backend_name: "mpi", "nccl", "none"
  const char* name() const { return name_; }        // "all_reduce", ..., "graph replay"
  const std::string& label() const { return label_; }
  int64_t bytes() const { return bytes_; }  // 0: not a transfer (a graph replay)
  Clock::time_point started() const { return started_; }

  void mark_finished() { finished_.store(true, std::memory_order_release); }
  // Called from the watchdog's thread; NCCL overrides it to query its event.
  virtual bool poll_finished() { return finished_.load(std::memory_order_acquire); }

 private:
  const char* backend_;
  const char* name_;
  std::string label_;
  int64_t bytes_;
  Clock::time_point started_ = Clock::now();
  std::atomic<bool> finished_{false};
};

class Communicator {
 public:
  // Does not take ownership of `comm` (MPI_COMM_WORLD, MPI_COMM_SELF, or a caller's).
  // kNccl creates an NCCL communicator over the same ranks (collective), on GPU `cuda_device`.
  explicit Communicator(MPI_Comm comm, CommBackendKind backend = CommBackendKind::kMpi,
                        int cuda_device = 0);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm mpi_comm() const { return comm_; }
  CommBackendKind backend() const { return kind_; }

  // A collective unfinished after `seconds` ends the job, naming it (Note [Communication
  // watchdog]); 0 turns the watchdog off. Applies to operations started afterwards. Every rank
  // should set the same value.
  void set_timeout(double seconds);
  double timeout_s() const;

  // Call with true before capturing CUDA graphs that contain this Communicator's operations, and
  // with false after (Note [Graph capture]): captured operations are not watched, Work::test()
  // queries no events, and the watchdog pauses meanwhile.
  void set_capturing(bool capturing);
  bool capturing() const { return capturing_; }
  // Launches such a graph: runs `launch` (which queues the replay) as the backend launches its
  // own operations (NCCL: never while its communicator is aborted). Throws Error instead when
  // the watchdog has reported a failure or the backend was aborted.
  void launch_captured(const std::function<void()>& launch);
  // Registers work that is not one of this Communicator's operations but holds them (a graph
  // replay) with the watchdog; nothing without a timeout (Note [Communication watchdog]).
  void watch(std::shared_ptr<WatchedOperation> operation);

  // Tensors are contiguous, of float, double, int32, int64, half or bfloat16 (with MPI, half
  // and bfloat16 are summed in float by an MPI operation of ours); on the host or a GPU with
  // MPI, on the GPU with NCCL. `label` says what the operation is for ("bucket 3"); the
  // watchdog names it when the operation stalls.

  // In place.
  Work all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum, const std::string& label = {});
  Work broadcast(at::Tensor& tensor, int root, const std::string& label = {});
  // `input` has size() equal slices; this rank's reduced slice lands in `output`
  // (input.numel() / size() elements). `output` may be this rank's own slice of `input` (in
  // place, as NCCL allows it); with one rank that is the identity.
  Work reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op = ReduceOp::kSum,
                      const std::string& label = {});
  // In place: `buffer` has size() equal slices, this rank's own is at rank() * slice; afterwards
  // every slice holds its rank's data.
  Work all_gather_in_place(at::Tensor& buffer, const std::string& label = {});

  // Small blocking collectives of host values (loss sums, counts, agreement, control data), over
  // MPI whatever the backend; watched like the rest. Every rank of the communicator calls them
  // in the same order.
  double all_reduce_scalar(double value, ReduceOp op = ReduceOp::kSum, const std::string& label = {});
  int64_t all_reduce_count(int64_t value, ReduceOp op = ReduceOp::kSum, const std::string& label = {});
  // Element-wise, in place; the same length on every rank.
  void all_reduce_doubles(std::vector<double>& values, ReduceOp op = ReduceOp::kSum,
                          const std::string& label = {});
  // The same, not waited for: `values` holds the result once the Work is waited for, and must
  // live until then. Not watched: it is meant to stay unfinished while the caller goes on (Note
  // [Stop agreement] in step_agreement.h).
  Work start_all_reduce_doubles(std::vector<double>& values, ReduceOp op,
                                const std::string& label = {});
  // Every rank's `value`, in rank order, at `root`; empty on the other ranks.
  std::vector<int64_t> gather_count(int64_t value, int root, const std::string& label = {});
  // Root's `values` to every rank (same length everywhere).
  void broadcast_ints(std::vector<int>& values, int root, const std::string& label = {});
  // Root's `value` to every rank (any length; the others' `value` is not read).
  std::string broadcast_string(const std::string& value, int root, const std::string& label = {});
  // Bytes from every rank to every rank (MPI_Alltoallv): `send` holds the bytes for rank 0, then
  // rank 1, ... (send_bytes[r] each); `recv` receives rank 0's, then rank 1's, ...
  // (recv_bytes[r] each). Both count vectors have size() entries; every count fits an int.
  void all_to_all_bytes(const uint8_t* send, const std::vector<int64_t>& send_bytes,
                        uint8_t* recv, const std::vector<int64_t>& recv_bytes,
                        const std::string& label = {});

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  CommBackendKind kind_;
  std::unique_ptr<CommBackend> backend_;    // comm_backend.h
  std::shared_ptr<const PeerProbe> probe_;  // several ranks: for the watchdog's message
  std::shared_ptr<CommWatchdog> watchdog_;  // while a timeout is set; the backend shares it
  bool capturing_ = false;
};

}  // namespace hpc_train

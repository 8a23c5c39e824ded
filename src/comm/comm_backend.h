// The Communicator's insides (comm.h), shared by comm.cpp, comm_mpi.cpp and comm_nccl.cpp and
// by nothing else but the tests that drive a backend directly: what a backend implements
// (Work::Impl, CommBackend), the backends' factories, and the watchdog's machinery (Note
// [Communication watchdog] in comm.h).
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hpc_train/comm/comm.h"

namespace hpc_train {

class Work::Impl {
 public:
  virtual ~Impl() = default;
  virtual void wait() = 0;  // MPI: blocks; NCCL: orders the caller's stream after the operation
  // true once done. NCCL: false for an operation captured in a CUDA graph, and while the
  // calling thread captures (Note [Graph capture]): wait() is what orders work after it.
  virtual bool test() = 0;
};

constexpr double kWatchdogPollMs = 100.0;
// How long the ending job waits for the other ranks to answer (Note [Naming a lost peer]): a TCP
// handshake within a cluster takes well under a millisecond; a retransmitted SYN comes after 1 s.
constexpr int kPeerProbeLimitMs = 2000;

// One backend's tensor collectives (the top of comm.h says what each backend does). `label`
// says what an operation is for; it is only reported.
class CommBackend {
 public:
  virtual ~CommBackend() = default;
  virtual Work all_reduce(at::Tensor& tensor, ReduceOp op, const std::string& label) = 0;
  virtual Work broadcast(at::Tensor& tensor, int root, const std::string& label) = 0;
  virtual Work reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op,
                              const std::string& label) = 0;
  virtual Work all_gather_in_place(at::Tensor& buffer, const std::string& label) = 0;

  // Operations started from now on are registered with `watchdog`; nullptr: none.
  void set_watchdog(std::shared_ptr<CommWatchdog> watchdog) { watchdog_ = std::move(watchdog); }
  // Note [Graph capture]. MPI operations run on the host and are never captured.
  virtual void set_capturing(bool capturing) { (void)capturing; }

  // Runs `launch`, which queues work holding this backend's collectives that was captured
  // earlier (a CUDA graph replay), as the backend launches its own: NCCL never while its
  // communicator is aborted, and throws Error after an abort (Note [Abort and launch] in
  // comm_nccl.cpp).
  virtual void launch_captured(const std::function<void()>& launch) { launch(); }

  // For the watchdog's thread (Note [Communication watchdog]). MPI reports its errors where they
  // happen and has no communicator of its own to abort, so these do nothing there.
  virtual void prepare_watchdog_thread() {}         // NCCL: the device and the capture mode
  virtual std::string async_error() { return {}; }  // NCCL: ncclCommGetAsyncError
  virtual void abort(const std::string& reason) { (void)reason; }  // NCCL: ncclCommAbort

 protected:
  const std::shared_ptr<CommWatchdog>& watchdog() const { return watchdog_; }

 private:
  std::shared_ptr<CommWatchdog> watchdog_;
};

// Note [Communication watchdog]. Non-copyable, non-movable (its thread refers to it); the
// Communicator and its backend hold it while a timeout is set, a Work only weakly. The
// destructor stops and joins the thread.
class CommWatchdog {
 public:
  // `probe` (may be null) names the ranks that no longer answer when the job ends.
  CommWatchdog(MPI_Comm comm, CommBackend& backend, std::shared_ptr<const PeerProbe> probe,
               double timeout_s);
  ~CommWatchdog();
  CommWatchdog(const CommWatchdog&) = delete;
  CommWatchdog& operator=(const CommWatchdog&) = delete;

  double timeout_s() const { return timeout_s_; }
  // While paused, the thread looks at nothing (Note [Graph capture]); time still counts.
  void set_paused(bool paused) { paused_.store(paused); }
  void watch(std::shared_ptr<WatchedOperation> operation);
  bool overdue(const WatchedOperation& operation) const;
  // Prints `[rank R@host] message`, aborts the backend's communicator and ends the job
  // (MPI_Abort). The first caller does so; a concurrent second one waits for the end.
  [[noreturn]] void end_job(const std::string& message);
  // "comm: all_reduce of bucket 3 (4096 B) did not finish within 300 s (backend mpi); rank 2@node3
  // does not answer (no answer within 2 s)"; no bytes for a graph replay. Takes up to
  // kPeerProbeLimitMs to ask the other ranks.
  std::string stall_message(const WatchedOperation& operation) const;
  // What the thread reported without ending the job (no MPI_THREAD_MULTIPLE); empty if nothing.
  std::string failure();

 private:
  void run();
  // The thread's answer to a failure (no lock held).
  void fail(const std::string& message, bool needs_backend_abort);

  MPI_Comm comm_;
  CommBackend& backend_;
  std::shared_ptr<const PeerProbe> probe_;
  double timeout_s_;
  std::string where_;                 // "rank R@host", R the world rank
  bool thread_may_call_mpi_ = false;  // MPI granted MPI_THREAD_MULTIPLE
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::string failure_;  // the failure the thread reported but could not end the job for
  std::vector<std::shared_ptr<WatchedOperation>> in_flight_;
  std::atomic<bool> paused_{false};
  std::atomic<bool> ending_{false};
  std::thread thread_;  // last: starts once everything above is ready
};

// The backends' factories: comm_mpi.cpp; comm_nccl.cpp, or in a build without CUDA
// comm_cpu.cpp, whose factory throws ConfigError.
std::unique_ptr<CommBackend> make_mpi_backend(MPI_Comm comm);
std::unique_ptr<CommBackend> make_nccl_backend(MPI_Comm comm, int cuda_device);

}  // namespace hpc_train

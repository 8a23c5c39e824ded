// The Communicator's backend-independent half: Work, the choice of backend, the watchdog.
// Scalars are in comm_mpi.cpp; whether NCCL exists, in comm_nccl.cpp (or comm_cpu.cpp).
#include "hpc_train/comm/comm.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>

#include "comm/comm_backend.h"
#include "hpc_train/comm/peer_probe.h"
#include "hpc_train/error.h"

namespace hpc_train {

const char* comm_backend_name(CommBackendKind kind) {
  return kind == CommBackendKind::kNccl ? "nccl" : kind == CommBackendKind::kNone ? "none" : "mpi";
}

Work::Work() = default;
Work::Work(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Work::Work(Work&&) noexcept = default;

Work::~Work() {
  // While an exception unwinds, the other ranks may never join this collective: waiting would
  // hang the job instead of letting run_or_abort end it (Note [Ending the job]).
  if (!impl_ || std::uncaught_exceptions() > 0) return;
  try {
    impl_->wait();
  } catch (...) {  // destructors never throw
  }
}

Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    Work finished(std::move(*this));  // waits for ours
    impl_ = std::move(other.impl_);
  }
  return *this;
}

void Work::wait() {
  if (impl_) impl_->wait();
}

bool Work::test() { return !impl_ || impl_->test(); }

namespace {

// CommBackendKind::kNone: with one rank, a sum, a broadcast or a gather leaves every buffer as
// it is, and a reduce-scatter's one slice is the input.
class NoneBackend : public CommBackend {
 public:
  Work all_reduce(at::Tensor&, ReduceOp, const std::string&) override { return Work(); }
  Work broadcast(at::Tensor&, int, const std::string&) override { return Work(); }
  Work reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp,
                      const std::string&) override {
    if (output.data_ptr() != input.data_ptr()) output.copy_(input);
    return Work();
  }
  Work all_gather_in_place(at::Tensor&, const std::string&) override { return Work(); }
};

}  // namespace

Communicator::Communicator(MPI_Comm comm, CommBackendKind backend, int cuda_device)
    : comm_(comm), kind_(backend) {
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  if (backend == CommBackendKind::kNone) {
    if (size_ != 1)
      throw ConfigError("--backend none runs one rank only (this job has " +
                        std::to_string(size_) + "); use mpi or nccl");
    backend_ = std::make_unique<NoneBackend>();
  } else if (backend == CommBackendKind::kMpi) {
    backend_ = make_mpi_backend(comm_);
  } else {
    backend_ = make_nccl_backend(comm_, cuda_device);  // a build without CUDA throws ConfigError
  }
  if (size_ > 1) probe_ = std::make_shared<const PeerProbe>(comm_);
}

Communicator::~Communicator() {
  // The watchdog's thread uses the backend: it stops first.
  if (backend_) backend_->set_watchdog(nullptr);
  watchdog_.reset();
}

double Communicator::timeout_s() const { return watchdog_ ? watchdog_->timeout_s() : 0.0; }

void Communicator::set_timeout(double seconds) {
  if (!(seconds >= 0.0))
    throw ConfigError("communication timeout " + std::to_string(seconds) +
                      " s: use a number of seconds >= 0 (0 = no timeout)");
  backend_->set_watchdog(nullptr);
  watchdog_.reset();
  if (seconds == 0.0) return;
  watchdog_ = std::make_shared<CommWatchdog>(comm_, *backend_, probe_, seconds);
  watchdog_->set_paused(capturing_);
  backend_->set_watchdog(watchdog_);
}

void Communicator::set_capturing(bool capturing) {
  capturing_ = capturing;
  backend_->set_capturing(capturing);
  if (watchdog_) watchdog_->set_paused(capturing);
}

void Communicator::launch_captured(const std::function<void()>& launch) {
  // A failure the watchdog could not end the job for: the replay's collectives would never
  // finish (or use an aborted communicator), and nothing would watch them any more.
  if (watchdog_) {
    const std::string failure = watchdog_->failure();
    if (!failure.empty()) throw Error(failure);
  }
  backend_->launch_captured(launch);
}

void Communicator::watch(std::shared_ptr<WatchedOperation> operation) {
  if (watchdog_) watchdog_->watch(std::move(operation));
}

Work Communicator::all_reduce(at::Tensor& tensor, ReduceOp op, const std::string& label) {
  return backend_->all_reduce(tensor, op, label);
}

Work Communicator::broadcast(at::Tensor& tensor, int root, const std::string& label) {
  return backend_->broadcast(tensor, root, label);
}

Work Communicator::reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op,
                                  const std::string& label) {
  return backend_->reduce_scatter(input, output, op, label);
}

Work Communicator::all_gather_in_place(at::Tensor& buffer, const std::string& label) {
  return backend_->all_gather_in_place(buffer, label);
}

// --- Note [Communication watchdog]

CommWatchdog::CommWatchdog(MPI_Comm comm, CommBackend& backend,
                           std::shared_ptr<const PeerProbe> probe, double timeout_s)
    : comm_(comm), backend_(backend), probe_(std::move(probe)), timeout_s_(timeout_s) {
  int world_rank = 0;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  where_ = "rank " + std::to_string(world_rank) + "@" + host;
  int thread_level = MPI_THREAD_SINGLE;
  MPI_CHECK(MPI_Query_thread(&thread_level));
  thread_may_call_mpi_ = thread_level >= MPI_THREAD_MULTIPLE;
  thread_ = std::thread([this] { run(); });
}

CommWatchdog::~CommWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void CommWatchdog::watch(std::shared_ptr<WatchedOperation> operation) {
  std::lock_guard<std::mutex> lock(mutex_);
  in_flight_.push_back(std::move(operation));
}

bool CommWatchdog::overdue(const WatchedOperation& operation) const {
  const std::chrono::duration<double> age = WatchedOperation::Clock::now() - operation.started();
  return age.count() > timeout_s_;
}

std::string CommWatchdog::stall_message(const WatchedOperation& operation) const {
  char timeout[32];
  std::snprintf(timeout, sizeof(timeout), "%g", timeout_s_);
  return std::string("comm: ") + operation.name() +
         (operation.label().empty() ? "" : " of " + operation.label()) +
         (operation.bytes() > 0 ? " (" + std::to_string(operation.bytes()) + " B)" : "") +
         " did not finish within " + timeout + " s (backend " + operation.backend() + ")" +
         (probe_ ? probe_->describe(std::chrono::milliseconds(kPeerProbeLimitMs)) : "");
}

std::string CommWatchdog::failure() {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

namespace {

// How long ending the job waits for the backend's abort (ncclCommAbort) before MPI_Abort ends
// the process regardless: aborting the communicator first lets kernels stuck on a peer return,
// but it must not be able to hang the very thing that ends the hang. (ncclCommAbort frees device
// memory, which waits for the device: it was seen to block for as long as a stream stays held
// up; bench/results-notes.md, comm.cpp kBackendAbortGrace.)
constexpr auto kBackendAbortGrace = std::chrono::seconds(5);

void abort_within_grace(CommBackend& backend, const std::string& reason) {
  struct Done {
    std::mutex mutex;
    std::condition_variable signal;
    bool done = false;
  };
  auto state = std::make_shared<Done>();
  std::thread([state, &backend, reason] {
    backend.abort(reason);
    std::lock_guard<std::mutex> lock(state->mutex);
    state->done = true;
    state->signal.notify_all();
  }).detach();  // the process ends right after; a hung abort must not be joined
  std::unique_lock<std::mutex> lock(state->mutex);
  state->signal.wait_for(lock, kBackendAbortGrace, [&] { return state->done; });
}

}  // namespace

void CommWatchdog::end_job(const std::string& message) {
  if (!ending_.exchange(true)) {
    std::fprintf(stderr, "[%s] %s\n", where_.c_str(), message.c_str());
    std::fflush(stderr);
    abort_within_grace(backend_, message);
    MPI_Abort(comm_, kExitRuntimeError);
  }
  // Another thread is ending the job; MPI_Abort does not come back to it either.
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

void CommWatchdog::fail(const std::string& message, bool needs_backend_abort) {
  if (thread_may_call_mpi_) end_job(message);
  // Without MPI_THREAD_MULTIPLE this thread must not call MPI. A stalled MPI operation is ended
  // by its own waiting thread (see MpiWork); an NCCL failure or a stalled graph replay is
  // reported here, and aborting the NCCL communicator makes the next NCCL operation throw, as
  // the failure recorded here makes the next replay (launch_captured), which ends the job
  // (runtime.h).
  if (!needs_backend_abort) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failure_ = message;
  }
  std::fprintf(stderr, "[%s] %s\n", where_.c_str(), message.c_str());
  std::fflush(stderr);
  backend_.abort(message);
}

void CommWatchdog::run() {
  backend_.prepare_watchdog_thread();
  const auto period = std::chrono::duration<double, std::milli>(kWatchdogPollMs);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, period, [this] { return stop_; })) {
    if (!failure_.empty() || paused_.load()) continue;
    // Operations that finished leave; the oldest unfinished one is first.
    in_flight_.erase(std::remove_if(in_flight_.begin(), in_flight_.end(),
                                    [](const auto& op) { return op->poll_finished(); }),
                     in_flight_.end());
    std::shared_ptr<WatchedOperation> stalled;
    if (!in_flight_.empty() && overdue(*in_flight_.front())) stalled = in_flight_.front();
    lock.unlock();
    const std::string async_error = backend_.async_error();
    if (!async_error.empty()) fail(async_error, /*needs_backend_abort=*/true);
    else if (stalled)
      fail(stall_message(*stalled), std::string(stalled->backend()) != "mpi");
    lock.lock();
  }
}

}  // namespace hpc_train

// The NCCL backend of the Communicator (comm.h): GPU tensors, one NCCL communicator per
// Communicator, bootstrapped over MPI, and a communication stream of its own. Built only when
// LibTorch has CUDA (a build without has comm_cpu.cpp instead); the only file that includes
// <nccl.h>.
//
// Note [Stream ordering]
// An operation records an event on the caller's current stream (where the tensor was produced)
// and makes the communication stream wait for it; the collective runs on the communication
// stream and records a "done" event. Work::wait makes the caller's stream wait for "done". Both
// waits happen on the GPU: the host never blocks inside a step, and computation queued after an
// operation but independent of it overlaps with it.
//
// The watchdog (Note [Communication watchdog] in comm.h) learns of completion from the "done"
// event, queried from its own thread, and of NCCL's asynchronous errors from
// ncclCommGetAsyncError; captured operations are left alone (Note [Graph capture]).
//
// Note [Abort and launch]
// The watchdog's thread (or, ending the job, a thread of its own) calls ncclCommAbort while the
// training thread may be launching a collective on the same communicator. ncclCommAbort frees
// the communicator: a launch running concurrently, or one after it, would use freed memory, or
// queue a kernel that waits forever for peers that have stopped. So every use of comm_ after
// construction holds launch_mutex_: a launch, the replay of a captured graph that holds
// collectives (launch_captured), the async-error query, the abort, the destruction. A launch
// checks, under the lock, that no abort has begun (aborting_, which abort sets before it takes
// the lock), so it is either queued completely before ncclCommAbort (which then ends its kernels
// as it ends every collective in flight) or throws Error with the abort's reason without
// touching comm_. A launch also checks before it takes the lock, so that once an abort has begun
// no launch waits for it: ncclCommAbort may block for as long as the GPU is held up.
// Launches hold the lock only while work is queued (host calls that return once the GPU has
// it), never while anything waits for the GPU or a peer: Work::wait makes a stream wait on an
// event and Work::test queries one, and neither touches comm_. An abort therefore waits at most
// for one enqueue. If an enqueue blocks itself (a full launch queue, a peer that never connects),
// the abort waits with it; CommWatchdog::end_job gives the abort a few seconds
// (kBackendAbortGrace in comm.cpp) and then ends the job regardless, so nothing hangs.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/comm_backend.h"
#include "hpc_train/comm/comm.h"
#include "hpc_train/runtime/cuda_check.h"
#include "hpc_train/error.h"

#define NCCL_CHECK(expr)                                                                    \
  do {                                                                                      \
    ncclResult_t nccl_check_rc_ = (expr);                                                   \
    if (nccl_check_rc_ != ncclSuccess)                                                      \
      throw ::hpc_train::Error(::hpc_train::describe_failed_call(                           \
          __FILE__, __LINE__, #expr, ncclGetErrorString(nccl_check_rc_)));                  \
  } while (0)

namespace hpc_train {

namespace {

ncclDataType_t nccl_type(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    default:
      throw Error(std::string("NCCL backend: no NCCL type for tensors of ") +
                  c10::toString(tensor.scalar_type()));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::kSum ? ncclSum : op == ReduceOp::kMax ? ncclMax : ncclMin;
}

void check_gpu_contiguous(const at::Tensor& tensor, const char* operation) {
  if (!tensor.defined() || !tensor.is_cuda() || !tensor.is_contiguous())
    throw Error(std::string("NCCL backend: ") + operation +
                " needs a defined, contiguous GPU tensor");
}

// A CUDA event, owned (RAII, non-copyable).
class Event {
 public:
  Event() { CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~Event() {
    if (event_) cudaEventDestroy(event_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Whether work queued on `stream` now would be captured into a CUDA graph.
bool is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// An NCCL operation is finished when its "done" event has completed. Queried from the
// watchdog's thread only; an error other than "not ready" counts as finished, because the
// caller's next CUDA call reports it where it can be handled.
class NcclOperation : public WatchedOperation {
 public:
  NcclOperation(const char* name, const std::string& label, int64_t bytes,
                std::shared_ptr<Event> done)
      : WatchedOperation("nccl", name, label, bytes), done_(std::move(done)) {}
  bool poll_finished() override {
    if (WatchedOperation::poll_finished()) return true;
    if (cudaEventQuery(done_->get()) == cudaErrorNotReady) return false;
    mark_finished();
    return true;
  }

 private:
  std::shared_ptr<Event> done_;
};

// Note [Stream ordering]. Holds the tensors until the caller's stream is ordered after the
// collective, so that the caching allocator cannot hand their memory to other work before.
class NcclWork : public Work::Impl {
 public:
  // `backend_capturing`: the backend's Communicator::set_capturing state.
  NcclWork(std::shared_ptr<Event> done, std::vector<at::Tensor> tensors, bool captured,
           std::shared_ptr<const std::atomic<bool>> backend_capturing)
      : done_(std::move(done)), tensors_(std::move(tensors)), captured_(captured),
        backend_capturing_(std::move(backend_capturing)) {}
  void wait() override {
    const at::Tensor& t = tensors_.front();
    const cudaStream_t caller = c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
    CUDA_CHECK(cudaStreamWaitEvent(caller, done_->get(), 0));
  }
  // Note [Graph capture]: no event query for a captured operation, nor while this thread
  // captures.
  bool test() override {
    if (captured_ || backend_capturing_->load()) return false;
    const at::Tensor& t = tensors_.front();
    if (is_capturing(c10::cuda::getCurrentCUDAStream(t.device().index()).stream())) return false;
    const cudaError_t status = cudaEventQuery(done_->get());
    if (status == cudaErrorNotReady) return false;
    CUDA_CHECK(status);
    return true;
  }

 private:
  std::shared_ptr<Event> done_;
  std::vector<at::Tensor> tensors_;
  bool captured_;
  std::shared_ptr<const std::atomic<bool>> backend_capturing_;
};

class NcclBackend : public CommBackend {
 public:
  NcclBackend(MPI_Comm comm, int cuda_device)
      : device_(static_cast<c10::DeviceIndex>(cuda_device)),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device_)) {
    int rank = 0, size = 1;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    MPI_CHECK(MPI_Comm_size(comm, &size));
    c10::cuda::CUDAGuard guard(device_);
    // MPI bootstraps NCCL: rank 0 makes the unique id, every rank receives it.
    ncclUniqueId id;
    if (rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm));
    NCCL_CHECK(ncclCommInitRank(&comm_, size, id, rank));
    rank_ = rank;
    size_ = size;
  }

  ~NcclBackend() override {
    // Under the lock against an abort from the thread that ends the job (Note [Abort and
    // launch]); no launch can follow, so waiting under it here delays nobody.
    std::lock_guard<std::mutex> lock(launch_mutex_);
    if (!comm_ || aborted_) return;
    // Unwinding towards MPI_Abort: the other ranks may be stuck in a collective, and
    // ncclCommDestroy would wait for them; abort instead (Note [Ending the job]).
    if (std::uncaught_exceptions() > 0) ncclCommAbort(comm_);
    else ncclCommDestroy(comm_);
  }

  // The watchdog's thread: CUDA calls there must not make a context on device 0, nor be
  // forbidden (or break a capture) while the main thread captures (Note [Graph capture]).
  void prepare_watchdog_thread() override {
    cudaSetDevice(device_);
    cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
    cudaThreadExchangeStreamCaptureMode(&mode);
  }

  void set_capturing(bool capturing) override { capturing_->store(capturing); }

  std::string async_error() override {
    std::lock_guard<std::mutex> lock(launch_mutex_);  // Note [Abort and launch]
    if (aborted_) return {};
    ncclResult_t result = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &result) != ncclSuccess || result == ncclSuccess ||
        result == ncclInProgress)
      return {};
    const std::string detail = ncclGetLastError(comm_);
    return std::string("comm: NCCL reported an asynchronous error: ") + ncclGetErrorString(result) +
           (detail.empty() ? "" : " (" + detail + ")") + " (backend nccl)";
  }

  // Ends the collectives in flight, so that no kernel waits forever for a peer; later
  // operations throw `reason` (Note [Abort and launch]).
  void abort(const std::string& reason) override {
    {
      std::lock_guard<std::mutex> lock(reason_mutex_);
      if (abort_reason_.empty()) abort_reason_ = reason;
    }
    aborting_.store(true);
    std::lock_guard<std::mutex> lock(launch_mutex_);
    if (aborted_) return;
    aborted_ = true;
    ncclCommAbort(comm_);
  }

  // A graph replay launches the collectives captured in it (Note [Abort and launch]).
  void launch_captured(const std::function<void()>& launch) override {
    throw_if_aborting();
    std::lock_guard<std::mutex> lock(launch_mutex_);
    throw_if_aborting();
    launch();
  }

  Work all_reduce(at::Tensor& tensor, ReduceOp op, const std::string& label) override {
    check_gpu_contiguous(tensor, "all_reduce");
    return launch("all_reduce", label, {tensor}, [&](cudaStream_t s) {
      NCCL_CHECK(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                               nccl_type(tensor), nccl_op(op), comm_, s));
    });
  }

  Work broadcast(at::Tensor& tensor, int root, const std::string& label) override {
    check_gpu_contiguous(tensor, "broadcast");
    return launch("broadcast", label, {tensor}, [&](cudaStream_t s) {
      NCCL_CHECK(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                               nccl_type(tensor), root, comm_, s));
    });
  }

  Work reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op,
                      const std::string& label) override {
    check_gpu_contiguous(input, "reduce_scatter");
    check_gpu_contiguous(output, "reduce_scatter");
    if (input.numel() != output.numel() * size_ || input.scalar_type() != output.scalar_type())
      throw Error("NCCL backend: reduce_scatter needs input of size() x output elements, one dtype");
    return launch("reduce_scatter", label, {input, output}, [&](cudaStream_t s) {
      NCCL_CHECK(ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(),
                                   nccl_type(input), nccl_op(op), comm_, s));
    });
  }

  Work all_gather_in_place(at::Tensor& buffer, const std::string& label) override {
    check_gpu_contiguous(buffer, "all_gather");
    if (buffer.numel() % size_ != 0)
      throw Error("NCCL backend: all_gather needs a buffer of size() equal slices");
    const int64_t slice = buffer.numel() / size_;
    return launch("all_gather", label, {buffer}, [&](cudaStream_t s) {
      // In place: NCCL reads this rank's slice from where the result puts it.
      char* base = static_cast<char*>(buffer.data_ptr());
      NCCL_CHECK(ncclAllGather(base + rank_ * slice * buffer.element_size(), base, slice,
                               nccl_type(buffer), comm_, s));
    });
  }

 private:
  // Bytes handed to the collective: the first tensor's (the input).
  template <typename Collective>
  Work launch(const char* name, const std::string& label, std::vector<at::Tensor> tensors,
              Collective&& collective) {
    c10::cuda::CUDAGuard guard(device_);
    const cudaStream_t caller = c10::cuda::getCurrentCUDAStream(device_).stream();
    const bool captured = capturing_->load() || is_capturing(caller);
    Event ready;
    auto done = std::make_shared<Event>();
    throw_if_aborting();
    {
      std::lock_guard<std::mutex> lock(launch_mutex_);  // Note [Abort and launch]
      throw_if_aborting();
      CUDA_CHECK(cudaEventRecord(ready.get(), caller));
      CUDA_CHECK(cudaStreamWaitEvent(stream_.stream(), ready.get(), 0));
      collective(stream_.stream());
      CUDA_CHECK(cudaEventRecord(done->get(), stream_.stream()));
    }
    if (watchdog() && !captured) {
      const at::Tensor& first = tensors.front();
      watchdog()->watch(std::make_shared<NcclOperation>(
          name, label, first.numel() * static_cast<int64_t>(first.element_size()), done));
    }
    return Work(
        std::make_unique<NcclWork>(std::move(done), std::move(tensors), captured, capturing_));
  }

  void throw_if_aborting() {
    if (!aborting_.load()) return;
    std::lock_guard<std::mutex> lock(reason_mutex_);
    throw Error(abort_reason_ + "; the NCCL communicator was aborted");
  }

  c10::DeviceIndex device_;
  c10::cuda::CUDAStream stream_;
  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  // Communicator::set_capturing; shared with the Works, which answer test() by it.
  std::shared_ptr<std::atomic<bool>> capturing_ = std::make_shared<std::atomic<bool>>(false);
  // Note [Abort and launch]: held around every use of comm_ after construction.
  std::mutex launch_mutex_;
  bool aborted_ = false;  // ncclCommAbort was called: comm_ is gone. Under launch_mutex_
  std::atomic<bool> aborting_{false};  // abort() has begun; set before it takes launch_mutex_
  std::mutex reason_mutex_;
  std::string abort_reason_;  // abort()'s; under reason_mutex_
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<CommBackend> make_nccl_backend(MPI_Comm comm, int cuda_device) {
  return std::make_unique<NcclBackend>(comm, cuda_device);
}

}  // namespace hpc_train

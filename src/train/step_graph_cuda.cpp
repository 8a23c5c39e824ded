// StepGraph and TrainingStreamScope of a GPU build (step_graph.h): LibTorch's CUDA graphs, the
// replay watched as a collective is. The CPU build's are in step_graph_cpu.cpp.
#include "hpc_train/train/step_graph.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <exception>
#include <mutex>
#include <optional>

#include "hpc_train/comm/comm.h"
#include "hpc_train/runtime/cuda_check.h"
#include "hpc_train/error.h"
#include "hpc_train/runtime/test_hooks.h"
#include "hpc_train/train/gpu_stall.h"

namespace hpc_train {

bool cuda_graphs_available() { return true; }

struct TrainingStreamScope::Impl {
  explicit Impl(c10::cuda::CUDAStream current)
      : previous(current), own(c10::cuda::getStreamFromPool(false, current.device_index())) {}
  c10::cuda::CUDAStream previous;
  c10::cuda::CUDAStream own;
  std::optional<c10::cuda::CUDAStreamGuard> guard;
};

TrainingStreamScope::TrainingStreamScope(bool cuda) {
  if (!cuda) return;
  impl_ = std::make_unique<Impl>(c10::cuda::getCurrentCUDAStream());
  // Pool streams do not synchronise with the default stream by themselves.
  at::cuda::CUDAEvent before;
  before.record(impl_->previous);
  before.block(impl_->own);
  impl_->guard.emplace(impl_->own);
}

TrainingStreamScope::~TrainingStreamScope() {
  if (!impl_) return;
  impl_->guard.reset();
  try {
    at::cuda::CUDAEvent after;
    after.record(impl_->own);
    after.block(impl_->previous);
  } catch (...) {  // destructors never throw
  }
}

namespace {

// A replay as the watchdog sees it (Note [Communication watchdog]): finished when the event
// recorded after it on the stream has completed. Queried from the watchdog's thread only, as
// the NCCL backend's operations are (comm_nccl.cpp); an error other than "not ready" counts as
// finished, because the training thread's next CUDA call reports it.
class ReplayOperation : public WatchedOperation {
 public:
  // With `device` current.
  ReplayOperation(CommBackendKind backend, const std::string& label, c10::DeviceIndex device)
      : WatchedOperation(comm_backend_name(backend), "graph replay", label, /*bytes=*/0),
        device_(device) {
    CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }
  ~ReplayOperation() override {
    if (done_) cudaEventDestroy(done_);
  }
  // Once, right after the replay was queued on `stream`; before that the event would count as
  // completed.
  void record(cudaStream_t stream) { CUDA_CHECK(cudaEventRecord(done_, stream)); }

  bool poll_finished() override {
    if (WatchedOperation::poll_finished()) return true;
    prepare_this_thread();
    if (cudaEventQuery(done_) == cudaErrorNotReady) return false;
    mark_finished();
    return true;
  }

 private:
  // The NCCL backend prepares the watchdog's thread (CommBackend::prepare_watchdog_thread);
  // --backend none does not. Either way this thread's CUDA calls go to the replay's device (no
  // context on device 0) in the thread-local capture mode (Note [Graph capture]).
  void prepare_this_thread() const {
    thread_local int prepared_device = -1;
    if (prepared_device == device_) return;
    cudaSetDevice(device_);
    cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
    cudaThreadExchangeStreamCaptureMode(&mode);
    prepared_device = device_;
  }

  c10::DeviceIndex device_;
  cudaEvent_t done_ = nullptr;
};

// Note [Failed capture]: the default generators of the CPU and of a GPU as they were when this
// was made, put back by restore().
class GeneratorsBefore {
 public:
  explicit GeneratorsBefore(c10::DeviceIndex device)
      : cpu_(at::detail::getDefaultCPUGenerator()),
        cuda_(at::globalContext().defaultGenerator(at::Device(at::kCUDA, device))) {
    {
      std::lock_guard<std::mutex> lock(cpu_.mutex());
      cpu_state_ = cpu_.get_state();
    }
    std::lock_guard<std::mutex> lock(cuda_.mutex());
    cuda_copy_ = cuda_.clone();
  }

  void restore() {
    {
      std::lock_guard<std::mutex> lock(cpu_.mutex());
      cpu_.set_state(cpu_state_);
    }
    // A state object of its own, out of any capture: set_state would write seed and offset into
    // the state that the failed capture may have left in capture mode.
    std::lock_guard<std::mutex> lock(cuda_.mutex());
    cuda_.graphsafe_set_state(cuda_copy_);
  }

 private:
  at::Generator cpu_;
  at::Generator cuda_;
  at::Tensor cpu_state_;
  at::Generator cuda_copy_;
};

// Ends the capture on `stream` that `graph` began and the step left by throwing (Note [Failed
// capture]): through LibTorch while CUDA still holds it valid, else (invalidated, or LibTorch's
// end failed) through CUDA, so that the stream works again. Leaves CUDA's last error cleared.
void end_failed_capture(at::cuda::CUDAGraph& graph, const c10::cuda::CUDAStream& stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream.stream(), &status) == cudaSuccess &&
      status == cudaStreamCaptureStatusActive) {
    try {
      graph.capture_end();  // instantiates the partial graph, which is never replayed
      return;
    } catch (const std::exception&) {
    }
  }
  cudaGraph_t broken = nullptr;
  if (cudaStreamEndCapture(stream.stream(), &broken) == cudaSuccess && broken)
    cudaGraphDestroy(broken);
  cudaGetLastError();
}

}  // namespace

struct StepGraph::Impl {
  std::optional<at::cuda::CUDAGraph> graph;
  // HPC_TRAIN_TEST_STALL_REPLAY_RANK (Note [Test hooks]); -1 in every real run.
  int test_stall_rank = test_stall_replay_rank();
  bool test_stalled = false;
};

StepGraph::StepGraph() : impl_(std::make_unique<Impl>()) {}
StepGraph::~StepGraph() = default;

bool StepGraph::capture(const std::function<void()>& enqueue_step,
                        const std::function<void()>& discard_step, std::string* why) {
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream();
  if (stream == c10::cuda::getDefaultCUDAStream(stream.device_index())) {
    if (why) *why = "the current stream is the default stream (no TrainingStreamScope)";
    return false;
  }
  GeneratorsBefore generators(stream.device_index());
  std::string failure;
  impl_->graph.emplace();
  try {
    impl_->graph->capture_begin();
    try {
      enqueue_step();
    } catch (...) {
      end_failed_capture(*impl_->graph, stream);
      throw;
    }
    impl_->graph->capture_end();
    return true;
  } catch (const c10::Error& e) {
    failure = e.what_without_backtrace();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  // Note [Failed capture]: the step's state first (its `.grad` tensors go back to the capture's
  // pool before the graph, which owns the pool, goes), then CUDA's last error that the
  // discarded work's calls left, then the generators.
  discard_step();
  impl_->graph.reset();
  cudaGetLastError();
  generators.restore();
  if (why) *why = failure;
  return false;
}

bool StepGraph::captured() const { return impl_->graph.has_value(); }

void StepGraph::replay(Communicator& comm, const std::string& label) {
  if (!impl_->graph) throw Error("StepGraph::replay: nothing captured");
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream();
  const c10::cuda::CUDAGuard device(stream.device_index());
  std::shared_ptr<ReplayOperation> watched;
  if (comm.timeout_s() > 0)
    watched = std::make_shared<ReplayOperation>(comm.backend(), label, stream.device_index());
  const bool test_stall = !impl_->test_stalled && comm.rank() == impl_->test_stall_rank;
  comm.launch_captured([&] {
    if (test_stall) {
      announce_test_stall_replay(comm.rank(), label);
      launch_gpu_stall(kTestStallReplayS, stream.stream());
      impl_->test_stalled = true;
    }
    impl_->graph->replay();
    if (watched) watched->record(stream.stream());
  });
  if (watched) comm.watch(std::move(watched));
}

}  // namespace hpc_train

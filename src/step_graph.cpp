#include "hpc_train/step_graph.h"

#include "hpc_train/error.h"

#ifdef HPC_TRAIN_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <exception>
#include <optional>
#endif

namespace hpc_train {

#ifdef HPC_TRAIN_WITH_CUDA

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

struct StepGraph::Impl {
  std::optional<at::cuda::CUDAGraph> graph;
};

StepGraph::StepGraph() : impl_(std::make_unique<Impl>()) {}
StepGraph::~StepGraph() = default;

bool StepGraph::capture(const std::function<void()>& enqueue_step, std::string* why) {
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream();
  if (stream == c10::cuda::getDefaultCUDAStream(stream.device_index())) {
    if (why) *why = "the current stream is the default stream (no TrainingStreamScope)";
    return false;
  }
  impl_->graph.emplace();
  try {
    impl_->graph->capture_begin();
    try {
      enqueue_step();
    } catch (...) {
      // End the broken capture so that the stream works again, then report.
      cudaGraph_t broken = nullptr;
      if (cudaStreamEndCapture(stream.stream(), &broken) == cudaSuccess && broken)
        cudaGraphDestroy(broken);
      cudaGetLastError();
      throw;
    }
    impl_->graph->capture_end();
  } catch (const c10::Error& e) {
    impl_->graph.reset();
    if (why) *why = e.what_without_backtrace();
    return false;
  } catch (const std::exception& e) {
    impl_->graph.reset();
    if (why) *why = e.what();
    return false;
  }
  return true;
}

bool StepGraph::captured() const { return impl_->graph.has_value(); }

void StepGraph::replay() {
  if (!impl_->graph) throw Error("StepGraph::replay: nothing captured");
  impl_->graph->replay();
}

#else

bool cuda_graphs_available() { return false; }

struct TrainingStreamScope::Impl {};
TrainingStreamScope::TrainingStreamScope(bool) {}
TrainingStreamScope::~TrainingStreamScope() = default;

struct StepGraph::Impl {};
StepGraph::StepGraph() : impl_(std::make_unique<Impl>()) {}
StepGraph::~StepGraph() = default;
bool StepGraph::capture(const std::function<void()>&, std::string* why) {
  if (why) *why = "this build has no CUDA";
  return false;
}
bool StepGraph::captured() const { return false; }
void StepGraph::replay() { throw Error("StepGraph::replay: this build has no CUDA"); }

#endif

}  // namespace hpc_train

// StepGraph and TrainingStreamScope of a CPU build (step_graph.h): LibTorch without CUDA has no
// graphs, so capture() declines and says why, and the stream scope has nothing to do. The GPU
// build's are in step_graph_cuda.cpp.
#include "hpc_train/train/step_graph.h"

#include "hpc_train/error.h"

namespace hpc_train {

bool cuda_graphs_available() { return false; }

struct TrainingStreamScope::Impl {};
TrainingStreamScope::TrainingStreamScope(bool) {}
TrainingStreamScope::~TrainingStreamScope() = default;

struct StepGraph::Impl {};
StepGraph::StepGraph() : impl_(std::make_unique<Impl>()) {}
StepGraph::~StepGraph() = default;
bool StepGraph::capture(const std::function<void()>&, const std::function<void()>&,
                        std::string* why) {
  if (why) *why = "this build has no CUDA";
  return false;
}
bool StepGraph::captured() const { return false; }
void StepGraph::replay(Communicator&, const std::string&) {
  throw Error("StepGraph::replay: this build has no CUDA");
}

}  // namespace hpc_train

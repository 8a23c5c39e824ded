// The fused path of mean_cross_entropy in a CPU build (cross_entropy.h): there are no kernels, so
// LibTorch's ops always run. The GPU build's is cross_entropy_cuda.cpp.
#include "hpc_train/error.h"
#include "hpc_train/train/cross_entropy.h"

namespace hpc_train {

bool fused_cross_entropy_applies(const torch::Tensor&, const torch::Tensor&) { return false; }

namespace detail {
torch::Tensor fused_cross_entropy(const torch::Tensor&, const torch::Tensor&, double) {
  throw Error("fused cross-entropy: this build has no CUDA");
}
}  // namespace detail

}  // namespace hpc_train

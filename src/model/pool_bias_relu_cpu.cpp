// The fused path of max_pool_bias_relu in a CPU build (pool_bias_relu.h): there are no kernels,
// so LibTorch's ops always run. The GPU build's is pool_bias_relu_cuda.cpp.
#include "hpc_train/model/pool_bias_relu.h"

#include "hpc_train/error.h"

namespace hpc_train::detail {

bool fused_pooling_takes(const torch::Tensor&, const torch::Tensor&) { return false; }

torch::Tensor fused_max_pool_bias_relu(const torch::Tensor&, const torch::Tensor&,
                                       at::MemoryFormat) {
  throw Error("fused pooling: this build has no CUDA");
}

}  // namespace hpc_train::detail

// The fused path of batch_norm_act in a CPU build (batch_norm_act.h): there are no kernels, so
// LibTorch's ops always run. The GPU build's is batch_norm_act_cuda.cpp.
#include "hpc_train/model/batch_norm_act.h"

#include "hpc_train/error.h"

namespace hpc_train::detail {

bool fused_kernels_take(const torch::Tensor&, const torch::nn::BatchNorm2dImpl&,
                        const torch::Tensor&) {
  return false;
}

torch::Tensor fused_batch_norm_act(const torch::Tensor&, torch::nn::BatchNorm2dImpl&,
                                   const torch::Tensor&, Activation) {
  throw Error("fused batch norm: this build has no CUDA");
}

}  // namespace hpc_train::detail

// Launching the fused batch-norm kernels (fused_batch_norm.h, Note [Fused batch norm]); the
// kernels and their work layout are in fused_batch_norm_kernels.cuh.
#include "hpc_train/model/fused_batch_norm.h"

#include <cuda_runtime.h>

#include <string>

#include "hpc_train/error.h"
#include "hpc_train/model/fused_batch_norm_kernels.cuh"
#include "hpc_train/runtime/cuda_check.h"
#include "hpc_train/runtime/cuda_float.cuh"

namespace hpc_train {

using namespace bn_kernels;

namespace {

int device_sm_count() {
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// The launch that forward_passes and backward_passes take: each kernel on `stream`, checked.
auto on_stream(cudaStream_t stream) {
  return [stream](auto kernel, dim3 grid, auto... arguments) {
    kernel<<<grid, kThreads, 0, stream>>>(arguments...);
    CUDA_CHECK(cudaGetLastError());
  };
}

}  // namespace

bool bn_layout_fits(int64_t rows, int64_t channels, KernelDtype dtype) {
  const int vector = kVectorBytes / element_bytes(dtype);
  return rows > 1 && channels > 0 && channels % vector == 0;
}

BnLayout bn_layout(int64_t rows, int64_t channels, KernelDtype dtype,
                   const BnLayoutLimits& limits) {
  if (!bn_layout_fits(rows, channels, dtype))
    throw Error("fused batch norm: no layout for " + std::to_string(rows) + " rows of " +
                std::to_string(channels) + " channels");
  if (limits.tile_vectors < 1 || limits.tile_vectors > kThreads || limits.rows_per_thread < 1 ||
      limits.blocks_per_sm < 1)
    throw Error("fused batch norm: layout limits out of range: tile_vectors " +
                std::to_string(limits.tile_vectors) + " (1 to " + std::to_string(kThreads) +
                "), rows_per_thread " + std::to_string(limits.rows_per_thread) +
                ", blocks_per_sm " + std::to_string(limits.blocks_per_sm) + " (at least 1)");
  return layout_for(rows, channels, dtype, device_sm_count(), limits);
}

void launch_bn_forward(const BnLayout& layout, const BnForwardArgs& args, cudaStream_t stream) {
  forward_passes(layout, args, on_stream(stream));
}

void launch_bn_backward(const BnLayout& layout, const BnBackwardArgs& args, cudaStream_t stream) {
  backward_passes(layout, args, on_stream(stream));
}

}  // namespace hpc_train

// The input kernel (input_kernel.h): a thread per element of the batch, the work of an element in
// input_items.h, which test_device_input also runs on the CPU.
#include "hpc_train/data/input_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "hpc_train/runtime/cuda_check.h"
#include "hpc_train/runtime/cuda_float.cuh"

namespace hpc_train {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads) input_batch_kernel(InputBatchArgs args, int64_t elements) {
  const int64_t element = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (element < elements) input_element<T, DeviceConvert>(args, element);
}

}  // namespace

void launch_input_batch(const InputBatchArgs& args, KernelDtype dtype, cudaStream_t stream) {
  const int64_t elements = input_elements(args);
  if (elements == 0) return;
  const auto blocks = static_cast<unsigned int>((elements + kThreads - 1) / kThreads);
  with_element_type(dtype, [&](auto element) {
    using T = decltype(element);
    input_batch_kernel<T><<<blocks, kThreads, 0, stream>>>(args, elements);
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace hpc_train

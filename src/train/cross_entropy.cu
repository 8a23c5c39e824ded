// The cross-entropy kernels (fused_cross_entropy.h, Note [Fused cross-entropy] in
// cross_entropy.h). Forward: one block; each thread takes rows kThreads apart (a row's work in
// cross_entropy_items.h) and adds up their losses, then a tree in shared memory adds the
// threads' sums in a fixed order: the same inputs give the same bits. A loss's rows are a
// micro-batch (tens to hundreds), so one block is enough. Backward: a thread per element.
#include "hpc_train/train/fused_cross_entropy.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "hpc_train/runtime/cuda_check.h"
#include "hpc_train/runtime/cuda_float.cuh"

namespace hpc_train {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_forward_kernel(CrossEntropyShape shape, const T* __restrict__ logits,
                                 const int64_t* __restrict__ labels, float* __restrict__ lse,
                                 float* __restrict__ loss) {
  __shared__ float sums[kThreads];
  float sum = 0.0f;
  for (int64_t row = threadIdx.x; row < shape.rows; row += kThreads)
    sum += cross_entropy_row<T, DeviceConvert>(shape, logits, labels, row, lse + row);
  sums[threadIdx.x] = sum;
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    __syncthreads();
    if (threadIdx.x < stride) sums[threadIdx.x] += sums[threadIdx.x + stride];
  }
  if (threadIdx.x == 0) *loss = sums[0] / static_cast<float>(shape.rows);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_backward_kernel(CrossEntropyShape shape, int64_t elements,
                                  const T* __restrict__ logits, const int64_t* __restrict__ labels,
                                  const float* __restrict__ lse,
                                  const float* __restrict__ grad_loss, T* __restrict__ grad_logits) {
  const int64_t element = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (element < elements)
    cross_entropy_grad_element<T, DeviceConvert>(shape, logits, labels, lse, grad_loss, element,
                                                 grad_logits);
}

}  // namespace

void launch_cross_entropy_forward(const CrossEntropyShape& shape, KernelDtype dtype,
                                  const void* logits, const int64_t* labels, float* lse,
                                  float* loss, cudaStream_t stream) {
  with_element_type(dtype, [&](auto element) {
    using T = decltype(element);
    cross_entropy_forward_kernel<T><<<1, kThreads, 0, stream>>>(
        shape, static_cast<const T*>(logits), labels, lse, loss);
  });
  CUDA_CHECK(cudaGetLastError());
}

void launch_cross_entropy_backward(const CrossEntropyShape& shape, KernelDtype dtype,
                                   const void* logits, const int64_t* labels, const float* lse,
                                   const float* grad_loss, void* grad_logits, cudaStream_t stream) {
  const int64_t elements = shape.rows * shape.classes;
  const auto blocks = static_cast<unsigned int>((elements + kThreads - 1) / kThreads);
  with_element_type(dtype, [&](auto element) {
    using T = decltype(element);
    cross_entropy_backward_kernel<T><<<blocks, kThreads, 0, stream>>>(
        shape, elements, static_cast<const T*>(logits), labels, lse, grad_loss,
        static_cast<T*>(grad_logits));
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace hpc_train

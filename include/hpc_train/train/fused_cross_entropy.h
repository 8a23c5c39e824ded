// The cross-entropy kernels (src/train/cross_entropy.cu; Note [Fused cross-entropy] in
// cross_entropy.h): the mean loss and each row's log-sum-exp in one launch, the logits'
// gradient in one more (cross_entropy_items.h says what each thread does).
//
// Torch-free: raw device pointers and sizes. Needs the CUDA runtime's headers, so only
// GPU-build code includes it; cross_entropy.h is the trainer's side.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "hpc_train/runtime/kernel_dtype.h"
#include "hpc_train/train/cross_entropy_items.h"

namespace hpc_train {

// logits [rows, classes] in `dtype`, labels [rows]; out: lse [rows], loss [] (the mean), fp32.
void launch_cross_entropy_forward(const CrossEntropyShape& shape, KernelDtype dtype,
                                  const void* logits, const int64_t* labels, float* lse,
                                  float* loss, cudaStream_t stream);
// grad_logits [rows, classes] in `dtype`, from the forward's lse and the loss's gradient
// grad_loss [] (on the device: a captured step reads it when it runs).
void launch_cross_entropy_backward(const CrossEntropyShape& shape, KernelDtype dtype,
                                   const void* logits, const int64_t* labels, const float* lse,
                                   const float* grad_loss, void* grad_logits, cudaStream_t stream);

}  // namespace hpc_train

// The input kernel (src/data/input_kernel.cu; Note [One input kernel] in device_input.cpp): a
// batch's gather, crop, flip, normalisation, cast and layout, and its labels, in one launch.
// Torch-free; needs the CUDA runtime's headers, so only GPU-build code includes it.
#pragma once

#include <cuda_runtime_api.h>

#include "hpc_train/data/input_items.h"
#include "hpc_train/runtime/kernel_dtype.h"

namespace hpc_train {

// `dtype`: the model input's.
void launch_input_batch(const InputBatchArgs& args, KernelDtype dtype, cudaStream_t stream);

}  // namespace hpc_train

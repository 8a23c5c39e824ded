// A fault for tests (HPC_TRAIN_TEST_STALL_REPLAY_RANK, Note [Test hooks] in test_hooks.h): a
// kernel that holds a stream up for a while (src/train/gpu_stall.cu), as a collective whose peer
// never arrives would. Torch-free; needs the CUDA runtime's headers, so only GPU-build code
// includes it (HPC_TRAIN_WITH_CUDA).
#pragma once

#include <cuda_runtime_api.h>

namespace hpc_train {

// Queues on `stream` one single-thread kernel that sleeps in 1 ms steps until `seconds` have
// passed on the GPU's global timer, and then ends: work queued after it waits that long, and the
// GPU is never held for good.
void launch_gpu_stall(double seconds, cudaStream_t stream);

}  // namespace hpc_train

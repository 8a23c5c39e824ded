// CudaProfilerRange of a CUDA build (cuda_profiler.h).
#include <cuda_profiler_api.h>

#include "hpc_train/runtime/cuda_check.h"
#include "hpc_train/runtime/cuda_profiler.h"

namespace hpc_train {

void CudaProfilerRange::start() { CUDA_CHECK(cudaProfilerStart()); }

void CudaProfilerRange::stop() { CUDA_CHECK(cudaProfilerStop()); }

}  // namespace hpc_train

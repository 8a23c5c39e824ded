// CudaProfilerRange of a CPU build (cuda_profiler.h): no GPU, no profiler range to open.
#include "hpc_train/runtime/cuda_profiler.h"

namespace hpc_train {

void CudaProfilerRange::start() {}

void CudaProfilerRange::stop() {}

}  // namespace hpc_train

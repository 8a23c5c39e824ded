// CUDA runtime calls: the check macro of the CUDA code (as MPI_CHECK in error.h and H5_CHECK in
// the HDF5 code), throwing Error with CUDA's own error string. GPU build only: it needs the
// CUDA runtime's headers.
#pragma once

#include <cuda_runtime_api.h>

#include "hpc_train/error.h"

#define CUDA_CHECK(expr)                                                                    \
  do {                                                                                      \
    cudaError_t cuda_check_rc_ = (expr);                                                    \
    if (cuda_check_rc_ != cudaSuccess)                                                      \
      throw ::hpc_train::Error(::hpc_train::describe_failed_call(                           \
          __FILE__, __LINE__, #expr, cudaGetErrorString(cuda_check_rc_)));                  \
  } while (0)

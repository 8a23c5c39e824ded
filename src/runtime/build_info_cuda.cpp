// cuda_build_items of a GPU build (build_info.h): what the CUDA runtime, the driver, cuDNN (as
// LibTorch loaded it) and NCCL say of themselves, and the architectures our kernels were
// compiled for.
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "hpc_train/runtime/build_info.h"

namespace hpc_train {
namespace {

// CUDA encodes major * 1000 + minor * 10 (12040 is 12.4).
std::string cuda_version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

// cuDNN 9 encodes major * 10000 + minor * 100 + patch; cuDNN 8 major * 1000 + minor * 100 + patch.
std::string cudnn_version_text(long version) {
  const long major_unit = version >= 90000 ? 10000 : 1000;
  return std::to_string(version / major_unit) + "." +
         std::to_string(version % major_unit / 100) + "." + std::to_string(version % 100);
}

// NCCL 2.9 and later encode major * 10000 + minor * 100 + patch (22803 is 2.28.3).
std::string nccl_version_text(int version) {
  const int major_unit = version >= 20900 ? 10000 : 1000;
  return std::to_string(version / major_unit) + "." +
         std::to_string(version % major_unit / 100) + "." + std::to_string(version % 100);
}

}  // namespace

std::vector<BuildItem> cuda_build_items() {
  int runtime_version = 0, driver_version = 0, nccl_version = 0;
  const std::string runtime = cudaRuntimeGetVersion(&runtime_version) == cudaSuccess
                                  ? cuda_version_text(runtime_version)
                                  : "unknown";
  // 0 (or an error) when no driver is installed: the binary can still print its build.
  const std::string driver =
      cudaDriverGetVersion(&driver_version) == cudaSuccess && driver_version > 0
          ? cuda_version_text(driver_version) + " (the newest CUDA the driver supports)"
          : "no driver";
  const std::string cudnn = at::globalContext().hasCuDNN()
                                ? cudnn_version_text(at::detail::getCUDAHooks().versionCuDNN())
                                : "none";
  const std::string nccl =
      ncclGetVersion(&nccl_version) == ncclSuccess ? nccl_version_text(nccl_version) : "unknown";
  return {{"cuda_runtime", "CUDA runtime", runtime},
          {"cuda_driver", "CUDA driver", driver},
          {"cudnn", "cuDNN", cudnn},
          {"nccl", "NCCL", nccl},
          {"cuda_architectures", "CUDA architectures", HPC_TRAIN_CUDA_ARCHITECTURES}};
}

}  // namespace hpc_train

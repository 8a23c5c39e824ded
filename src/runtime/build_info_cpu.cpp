// cuda_build_items of a CPU build (build_info.h): LibTorch without CUDA, no NCCL.
#include "hpc_train/runtime/build_info.h"

namespace hpc_train {

std::vector<BuildItem> cuda_build_items() {
  return {{"cuda_runtime", "CUDA runtime", "none (CPU build)"},
          {"cuda_driver", "CUDA driver", "none (CPU build)"},
          {"cudnn", "cuDNN", "none (CPU build)"},
          {"nccl", "NCCL", "none (CPU build)"},
          {"cuda_architectures", "CUDA architectures", "none (CPU build)"}};
}

}  // namespace hpc_train

// The element types our kernels take (fused_optimizer.cu, fused_batch_norm.cu): one enum for
// every launcher's interface, torch-free so that nvcc compiles the kernels without LibTorch.
// LibTorch's side maps its scalar types here in kernel_dtype_torch.h; the kernels' side turns
// the enum back into C++ types with with_element_type in cuda_float.cuh.
#pragma once

#include <cstdint>

namespace hpc_train {

enum class KernelDtype : int32_t { kFloat32, kFloat16, kBFloat16 };

inline int element_bytes(KernelDtype dtype) { return dtype == KernelDtype::kFloat32 ? 4 : 2; }

}  // namespace hpc_train

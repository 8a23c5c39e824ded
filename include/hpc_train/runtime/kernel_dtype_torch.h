// LibTorch's scalar types as our kernels' KernelDtype (kernel_dtype.h), for the GPU build's
// callers of the kernels.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>

#include "hpc_train/runtime/kernel_dtype.h"

namespace hpc_train {

// nullopt for a type no kernel of ours takes.
inline std::optional<KernelDtype> kernel_dtype_of(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Float: return KernelDtype::kFloat32;
    case c10::ScalarType::Half: return KernelDtype::kFloat16;
    case c10::ScalarType::BFloat16: return KernelDtype::kBFloat16;
    default: return std::nullopt;
  }
}

}  // namespace hpc_train

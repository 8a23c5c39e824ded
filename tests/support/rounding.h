// The rounding of the dtypes the kernels compute in, for the tolerances of the tests that compare
// them with a float64 reference.
#pragma once

#include <c10/core/ScalarType.h>

namespace hpc_train::testing {

// u, half the spacing of the dtype's numbers at 1: rounding a normal value x to the dtype moves
// it by at most u |x| (float32, float16, bfloat16).
inline double unit_roundoff(c10::ScalarType dtype) {
  return dtype == c10::kFloat ? 0x1p-24 : dtype == c10::kHalf ? 0x1p-11 : 0x1p-8;
}

// Half the spacing of the dtype's subnormals: the rounding error of a value too small to be
// normal, where u |value| no longer bounds it (fp16's start below 6e-5).
inline double subnormal_rounding(c10::ScalarType dtype) {
  return dtype == c10::kFloat ? 0x1p-150 : dtype == c10::kHalf ? 0x1p-25 : 0x1p-134;
}

}  // namespace hpc_train::testing

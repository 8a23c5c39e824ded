// The conversions that our kernels' per-thread functions take as a parameter (DeviceConvert in
// cuda_float.cuh on the GPU), on the host: LibTorch's float, Half and BFloat16 casts, which
// round to nearest even. The tests that run those functions on the CPU pass this one.
#pragma once

namespace hpc_train::testing {

struct HostConvert {
  template <typename T>
  static float to_float(T x) {
    return static_cast<float>(x);
  }
  template <typename T>
  static T from_float(float x) {
    return static_cast<T>(x);
  }
};

}  // namespace hpc_train::testing

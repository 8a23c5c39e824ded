// What one thread of the fused pooling kernels does (fused_pooling.cu; Note [Fused pooling] in
// pool_bias_relu.h), as functions that compile for the GPU and for the host: the kernels call
// them once per item, and test_kernel_items calls them over every item on the CPU, so
// that the indexing, the tie and NaN rules and the masks are checked where CI runs (the GPU
// test checks the kernels themselves).
//
// An item is one output pixel's run of V channels (V = 16 bytes of elements: 8 at 16 bits, 4 at
// 32), items ordered pixel-major: item = pixel x (channels / V) + vector. The input and its
// gradient are NHWC [N, H, W, C] in memory, read and written 16 bytes at a time; the pooled
// output and its gradient have the strides the caller gives (NHWC, or NCHW for a flatten that
// follows), read and written 16 bytes at a time where the channels are contiguous.
//
// The caller passes the conversions as `Convert`, with static `float to_float(T)` and
// `T from_float<T>(float)` for its element types, each rounding to nearest even as LibTorch's
// casts: DeviceConvert (cuda_float.cuh) in the kernels, the tests' HostConvert on the CPU.
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define HPC_TRAIN_ITEM_FUNCTION __host__ __device__ __forceinline__
#else
#define HPC_TRAIN_ITEM_FUNCTION inline
#endif

namespace hpc_train {

// The input [N, C, H, W] (NHWC in memory) and the pooled output [N, C, H / 2, W / 2] (floor:
// an odd last row or column is not pooled), with the output's element strides.
struct PoolShape {
  int64_t batch = 0, channels = 0, height = 0, width = 0;
  int64_t pooled_height = 0, pooled_width = 0;
  int64_t out_stride_n = 0, out_stride_c = 0, out_stride_h = 0, out_stride_w = 0;
};

template <typename T>
constexpr int kPoolVectorElements = 16 / static_cast<int>(sizeof(T));

template <typename T>
struct alignas(16) PoolVector {
  T element[kPoolVectorElements<T>];
};

// The 2x2 window's argmax per channel, 0..3 in scan order ((0,0), (0,1), (1,0), (1,1)).
template <int V>
struct alignas(V) WindowIndices {
  uint8_t index[V];
};

template <typename T>
HPC_TRAIN_ITEM_FUNCTION int64_t pool_items(const PoolShape& s) {
  return s.batch * s.pooled_height * s.pooled_width * (s.channels / kPoolVectorElements<T>);
}

// Where an item lies: its output pixel and first channel.
struct PoolItemPlace {
  int64_t n, oh, ow, c;
  int64_t pixel;  // n x pooled_height x pooled_width + oh x pooled_width + ow
};

template <typename T>
HPC_TRAIN_ITEM_FUNCTION PoolItemPlace pool_item_place(const PoolShape& s, int64_t item) {
  const int64_t vectors = s.channels / kPoolVectorElements<T>;
  PoolItemPlace p;
  p.pixel = item / vectors;
  p.c = (item % vectors) * kPoolVectorElements<T>;
  p.ow = p.pixel % s.pooled_width;
  p.oh = (p.pixel / s.pooled_width) % s.pooled_height;
  p.n = p.pixel / (s.pooled_width * s.pooled_height);
  return p;
}

// The input's element offset of window position k's pixel, channel p.c.
HPC_TRAIN_ITEM_FUNCTION int64_t pool_input_offset(const PoolShape& s, const PoolItemPlace& p,
                                                  int k) {
  const int64_t h = 2 * p.oh + k / 2, w = 2 * p.ow + k % 2;
  return ((p.n * s.height + h) * s.width + w) * s.channels + p.c;
}

HPC_TRAIN_ITEM_FUNCTION int64_t pool_output_offset(const PoolShape& s, const PoolItemPlace& p) {
  return p.n * s.out_stride_n + p.c * s.out_stride_c + p.oh * s.out_stride_h +
         p.ow * s.out_stride_w;
}

// V elements of an output-shaped tensor at `offset`, channels `out_stride_c` apart.
template <typename T>
HPC_TRAIN_ITEM_FUNCTION PoolVector<T> load_pooled(const PoolShape& s, const T* base,
                                                  int64_t offset) {
  if (s.out_stride_c == 1) return *reinterpret_cast<const PoolVector<T>*>(base + offset);
  PoolVector<T> v;
  for (int i = 0; i < kPoolVectorElements<T>; ++i) v.element[i] = base[offset + i * s.out_stride_c];
  return v;
}

template <typename T>
HPC_TRAIN_ITEM_FUNCTION void store_pooled(const PoolShape& s, T* base, int64_t offset,
                                          const PoolVector<T>& v) {
  if (s.out_stride_c == 1) {
    *reinterpret_cast<PoolVector<T>*>(base + offset) = v;
    return;
  }
  for (int i = 0; i < kPoolVectorElements<T>; ++i) base[offset + i * s.out_stride_c] = v.element[i];
}

// Forward: y = relu(max over the window of x + bias), and the window's argmax per channel.
// As LibTorch: the first maximum in scan order wins a tie; a NaN wins over any number (the
// window's last NaN); the add is one fp32 sum rounded once, and relu keeps a NaN. ReLU after
// the rounding (LibTorch's order) and before it give the same value: rounding keeps the sign.
template <typename T, typename Convert>
HPC_TRAIN_ITEM_FUNCTION void pool_bias_relu_forward_item(const PoolShape& s, int64_t item,
                                                         const T* x, const T* bias, T* y,
                                                         uint8_t* window_index) {
  constexpr int V = kPoolVectorElements<T>;
  const PoolItemPlace p = pool_item_place<T>(s, item);
  float best[V];
  WindowIndices<V> argmax;
  for (int i = 0; i < V; ++i) {
    best[i] = -INFINITY;
    argmax.index[i] = 0;
  }
  for (int k = 0; k < 4; ++k) {
    const PoolVector<T> in = *reinterpret_cast<const PoolVector<T>*>(x + pool_input_offset(s, p, k));
    for (int i = 0; i < V; ++i) {
      const float value = Convert::to_float(in.element[i]);
      if (value > best[i] || value != value) {  // value != value: NaN
        best[i] = value;
        argmax.index[i] = static_cast<uint8_t>(k);
      }
    }
  }
  PoolVector<T> out;
  for (int i = 0; i < V; ++i) {
    const float sum = best[i] + Convert::to_float(bias[p.c + i]);
    out.element[i] = Convert::template from_float<T>(sum <= 0.0f ? 0.0f : sum);  // a NaN stays
  }
  store_pooled(s, y, pool_output_offset(s, p), out);
  *reinterpret_cast<WindowIndices<V>*>(window_index + item * V) = argmax;
}

// Backward: the ReLU's mask from y (LibTorch's threshold_backward: the gradient passes where
// y > 0 or y is NaN), the masked gradient written into the window's argmax in `dx`, zero at its
// other three pixels, and returned in `bias_terms` as floats: the item's terms of the bias's
// gradient, which is their sum over batch and pixels. An odd last row or column of dx is left to
// the caller (zero).
template <typename T, typename Convert>
HPC_TRAIN_ITEM_FUNCTION void pool_bias_relu_backward_item(
    const PoolShape& s, int64_t item, const T* dy, const T* y, const uint8_t* window_index, T* dx,
    float (&bias_terms)[kPoolVectorElements<T>]) {
  constexpr int V = kPoolVectorElements<T>;
  const PoolItemPlace p = pool_item_place<T>(s, item);
  const int64_t out_offset = pool_output_offset(s, p);
  const PoolVector<T> grad = load_pooled(s, dy, out_offset);
  const PoolVector<T> out = load_pooled(s, y, out_offset);
  const WindowIndices<V> argmax = *reinterpret_cast<const WindowIndices<V>*>(window_index + item * V);
  const T zero = Convert::template from_float<T>(0.0f);
  PoolVector<T> masked;
  for (int i = 0; i < V; ++i) {
    masked.element[i] = Convert::to_float(out.element[i]) <= 0.0f ? zero : grad.element[i];
    bias_terms[i] = Convert::to_float(masked.element[i]);
  }
  for (int k = 0; k < 4; ++k) {
    PoolVector<T> in;
    for (int i = 0; i < V; ++i) in.element[i] = argmax.index[i] == k ? masked.element[i] : zero;
    *reinterpret_cast<PoolVector<T>*>(dx + pool_input_offset(s, p, k)) = in;
  }
}

}  // namespace hpc_train

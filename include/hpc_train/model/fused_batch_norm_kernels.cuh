// The fused batch-norm kernels (Note [Fused batch norm] in fused_batch_norm.h) and the layout
// arithmetic they assume. fused_batch_norm.cu launches them; test_fused_batch_norm_emulated
// compiles them for the host and runs them on the CPU (tests/support/cuda_emulation.h), so that
// the CPU build's tests check their arithmetic and indexing too. Device code: include it from a
// .cu file, or after cuda_emulation.h.
//
// Work layout: activations are [rows, channels] with channels contiguous. A thread owns one
// 16-byte vector of channels (V of them) and walks rows `row_lanes` apart, so a warp reads
// consecutive vectors (whole rows when the channels are few): coalesced, and each thread's
// channels, hence its per-channel state, never change. A block covers one channel tile and a
// run of rows; it merges its threads' results in shared memory (a tree over the row lanes, a
// fixed order) and writes them as one partial per channel. The finishing kernels give each
// channel a warp whose lanes merge the partials, strided, then a shuffle tree of the 32: a fixed
// order again. (Loading several rows into registers before adding them up made the backward
// sums slower than this plain loop that the compiler unrolls: bench/results-notes.md,
// Note [Fused batch norm].)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "hpc_train/model/fused_batch_norm.h"
#include "hpc_train/runtime/cuda_float.cuh"

namespace hpc_train::bn_kernels {

constexpr int kThreads = 256;           // per block, every kernel
constexpr int kVectorBytes = 16;
constexpr int kWarpSize = 32;
// The finishing kernels: a warp per channel, its lanes over the partials, kPartialsInFlight
// loads at a time; the lanes then merge by shuffles (a fixed tree).
constexpr int kFinishChannels = kThreads / kWarpSize;
constexpr int kPartialsInFlight = 8;

template <typename T>
__host__ __device__ constexpr int vector_elements() { return kVectorBytes / static_cast<int>(sizeof(T)); }

template <typename T>
struct alignas(kVectorBytes) Vector {
  T element[vector_elements<T>()];
};

template <typename T>
__device__ __forceinline__ void load_vector(const T* p, float* out) {
  const Vector<T> v = *reinterpret_cast<const Vector<T>*>(p);
#pragma unroll
  for (int i = 0; i < vector_elements<T>(); ++i) out[i] = to_float(v.element[i]);
}

// V per-channel floats (V = 4 or 8), 16 bytes at a time: `p` is at a multiple of V.
template <int V>
__device__ __forceinline__ void load_floats(const float* p, float* out) {
#pragma unroll
  for (int i = 0; i < V; i += 4) load_vector(p + i, out + i);
}

template <typename T>
__device__ __forceinline__ void store_vector(T* p, const float* in) {
  Vector<T> v;
#pragma unroll
  for (int i = 0; i < vector_elements<T>(); ++i) v.element[i] = from_float<T>(in[i]);
  *reinterpret_cast<Vector<T>*>(p) = v;
}

// The thread's place in a partial block: its channel vector and row lane.
struct Place {
  int64_t first_channel;  // of the thread's vector
  int lane;
  bool active;            // has channels and a lane (a layout may leave threads idle)
  int64_t row_begin, row_end;
};

__device__ __forceinline__ Place place_of(const BnLayout& layout, int vector) {
  Place p;
  const int tile_vector = threadIdx.x % layout.tile_vectors;
  p.lane = threadIdx.x / layout.tile_vectors;
  p.first_channel =
      (static_cast<int64_t>(blockIdx.y) * layout.tile_vectors + tile_vector) * vector;
  p.active = p.lane < layout.row_lanes && p.first_channel < layout.channels;
  p.row_begin = static_cast<int64_t>(blockIdx.x) * layout.rows_per_block;
  p.row_end = min(layout.rows, p.row_begin + layout.rows_per_block);
  return p;
}

// The block's tree over its row lanes, in shared memory: at strides 1, 2, 4, ... a lane takes
// in the slot `stride` lanes on (merge(other thread)), so that lane 0 of each channel vector ends
// with the block's result, which it then writes (write_partial(index of its first channel in
// the [row_blocks, channels] partials)). Every thread of the block calls it.
template <typename Merge, typename Write>
__device__ __forceinline__ void reduce_row_lanes(const BnLayout& layout, const Place& p,
                                                 Merge merge, Write write_partial) {
  for (int stride = 1; stride < layout.row_lanes; stride *= 2) {
    __syncthreads();
    if (p.active && p.lane % (2 * stride) == 0 && p.lane + stride < layout.row_lanes)
      merge(static_cast<int>(threadIdx.x) + stride * layout.tile_vectors);
  }
  if (p.active && p.lane == 0)
    write_partial(static_cast<int64_t>(blockIdx.x) * layout.channels + p.first_channel);
}

// Chan et al.'s merge of two (count, mean, sum of squared deviations) summaries.
__device__ __forceinline__ void merge_moments(float& n, float& mean, float& m2, float n_other,
                                              float mean_other, float m2_other) {
  const float total = n + n_other;
  if (n_other == 0.f) return;
  const float delta = mean_other - mean;
  const float other_share = n_other / total;
  mean += delta * other_share;
  m2 += m2_other + delta * delta * n * other_share;
  n = total;
}

// --- Forward.

// Each block: per channel of its tile, count, mean and M2 of its rows, into the partials.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    statistics_partial_kernel(BnLayout layout, const T* __restrict__ x,
                              float* __restrict__ partial_mean, float* __restrict__ partial_m2) {
  constexpr int V = vector_elements<T>();
  __shared__ float shared_n[kThreads];
  __shared__ float shared_mean[V][kThreads];  // [channel][thread]: no bank conflicts
  __shared__ float shared_m2[V][kThreads];
  const Place p = place_of(layout, V);
  float n = 0.f, mean[V], m2[V];
#pragma unroll
  for (int i = 0; i < V; ++i) mean[i] = m2[i] = 0.f;
  if (p.active) {
#pragma unroll 4  // a few rows' loads in flight
    for (int64_t row = p.row_begin + p.lane; row < p.row_end; row += layout.row_lanes) {
      float v[V];
      load_vector(x + row * layout.channels + p.first_channel, v);
      n += 1.f;
      const float inverse_n = 1.f / n;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float delta = v[i] - mean[i];
        mean[i] += delta * inverse_n;
        m2[i] += delta * (v[i] - mean[i]);
      }
    }
  }
  shared_n[threadIdx.x] = n;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    shared_mean[i][threadIdx.x] = mean[i];
    shared_m2[i][threadIdx.x] = m2[i];
  }
  reduce_row_lanes(
      layout, p,
      [&](int other) {
        float merged_n = 0.f;
#pragma unroll
        for (int i = 0; i < V; ++i) {
          merged_n = shared_n[threadIdx.x];
          merge_moments(merged_n, shared_mean[i][threadIdx.x], shared_m2[i][threadIdx.x],
                        shared_n[other], shared_mean[i][other], shared_m2[i][other]);
        }
        shared_n[threadIdx.x] = merged_n;
      },
      [&](int64_t at) {
#pragma unroll
        for (int i = 0; i < V; ++i) {
          partial_mean[at + i] = shared_mean[i][threadIdx.x];
          partial_m2[at + i] = shared_m2[i][threadIdx.x];
        }
      });
}

__device__ __forceinline__ float block_rows(const BnLayout& layout, int64_t block) {
  const int64_t begin = block * layout.rows_per_block;
  return static_cast<float>(min(layout.rows, begin + layout.rows_per_block) - begin);
}

// counter += 1 in the counter's own type, as LibTorch's add_(1) does it (in float for 16 bits).
__device__ __forceinline__ void count_one(void* counter, CounterType type) {
  switch (type) {
    case CounterType::kInt64: *static_cast<long long*>(counter) += 1; break;
    case CounterType::kFloat32: *static_cast<float*>(counter) += 1.f; break;
    case CounterType::kFloat16: {
      __half* c = static_cast<__half*>(counter);
      *c = __float2half(__half2float(*c) + 1.f);
      break;
    }
    case CounterType::kBFloat16: {
      __nv_bfloat16* c = static_cast<__nv_bfloat16*>(counter);
      *c = __float2bfloat16(__bfloat162float(*c) + 1.f);
      break;
    }
  }
}

// Per channel: the batch's mean and variance from the partials, the saved statistics, the
// running statistics, and the scale and shift the normalising pass applies; and the batch
// counted in num_batches_tracked (where given).
template <typename P>
__global__ void __launch_bounds__(kThreads)
    statistics_finish_kernel(BnLayout layout, const float* __restrict__ partial_mean,
                             const float* __restrict__ partial_m2, const P* __restrict__ weight,
                             const P* __restrict__ bias, P* __restrict__ running_mean,
                             P* __restrict__ running_var, float momentum, float eps,
                             float* __restrict__ save_mean, float* __restrict__ save_invstd,
                             float* __restrict__ scale, float* __restrict__ shift,
                             void* batches_tracked, CounterType batches_tracked_type) {
  if (batches_tracked != nullptr && blockIdx.x == 0 && threadIdx.x == 0)
    count_one(batches_tracked, batches_tracked_type);
  const int lane = threadIdx.x % kWarpSize;
  const int64_t channel = static_cast<int64_t>(blockIdx.x) * kFinishChannels + threadIdx.x / kWarpSize;
  if (channel >= layout.channels) return;  // a whole warp: the shuffles below stay full
  float n = 0.f, mean = 0.f, m2 = 0.f;
  for (int64_t first = lane; first < layout.row_blocks; first += kWarpSize * kPartialsInFlight) {
    float part_mean[kPartialsInFlight], part_m2[kPartialsInFlight];
#pragma unroll
    for (int k = 0; k < kPartialsInFlight; ++k) {
      const int64_t block = first + k * kWarpSize;
      if (block >= layout.row_blocks) continue;
      part_mean[k] = partial_mean[block * layout.channels + channel];
      part_m2[k] = partial_m2[block * layout.channels + channel];
    }
#pragma unroll
    for (int k = 0; k < kPartialsInFlight; ++k) {
      const int64_t block = first + k * kWarpSize;
      if (block >= layout.row_blocks) break;
      merge_moments(n, mean, m2, block_rows(layout, block), part_mean[k], part_m2[k]);
    }
  }
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float other_n = __shfl_down_sync(0xffffffffu, n, offset);
    const float other_mean = __shfl_down_sync(0xffffffffu, mean, offset);
    const float other_m2 = __shfl_down_sync(0xffffffffu, m2, offset);
    merge_moments(n, mean, m2, other_n, other_mean, other_m2);
  }
  if (lane != 0) return;
  const float rows = static_cast<float>(layout.rows);
  const float invstd = rsqrtf(m2 / rows + eps);
  save_mean[channel] = mean;
  save_invstd[channel] = invstd;
  const float channel_scale = invstd * to_float(weight[channel]);
  scale[channel] = channel_scale;
  shift[channel] = to_float(bias[channel]) - mean * channel_scale;
  running_mean[channel] =
      from_float<P>((1.f - momentum) * to_float(running_mean[channel]) + momentum * mean);
  running_var[channel] = from_float<P>((1.f - momentum) * to_float(running_var[channel]) +
                                       momentum * (m2 / (rows - 1.f)));
}

// y = relu(x * scale + shift + residual). A NaN stays NaN through the ReLU, as LibTorch's.
template <typename T, bool kRelu, bool kResidual>
__global__ void __launch_bounds__(kThreads)
    normalise_kernel(BnLayout layout, const T* __restrict__ x, const T* __restrict__ residual,
                     T* __restrict__ y, const float* __restrict__ scale,
                     const float* __restrict__ shift) {
  constexpr int V = vector_elements<T>();
  const int64_t vectors = layout.rows * layout.channels / V;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors;
       i += step) {
    const int64_t element = i * V;
    const int64_t channel = element % layout.channels;
    float v[V], s[V], b[V];
    load_vector(x + element, v);
    load_floats<V>(scale + channel, s);
    load_floats<V>(shift + channel, b);
    float r[V];
    if (kResidual) load_vector(residual + element, r);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float z = v[k] * s[k] + b[k];
      if (kResidual) z += r[k];
      if (kRelu) z = z < 0.f ? 0.f : z;
      v[k] = z;
    }
    store_vector(y + element, v);
  }
}

// --- Backward.

// The ReLU's gradient: dy where the output was positive (or NaN, as LibTorch's), else 0.
template <bool kRelu>
__device__ __forceinline__ float masked(float dy, float y) {
  return kRelu && y <= 0.f ? 0.f : dy;
}

// Each block: per channel of its tile, the sums of g and g (x - mean) over its rows, g being
// dy through the ReLU's mask, into the partials.
template <typename T, bool kRelu>
__global__ void __launch_bounds__(kThreads)
    gradient_sums_partial_kernel(BnLayout layout, const T* __restrict__ dy,
                                 const T* __restrict__ y, const T* __restrict__ x,
                                 const float* __restrict__ save_mean,
                                 float* __restrict__ partial_g, float* __restrict__ partial_gx) {
  constexpr int V = vector_elements<T>();
  __shared__ float shared_g[V][kThreads];
  __shared__ float shared_gx[V][kThreads];
  const Place p = place_of(layout, V);
  float sum_g[V], sum_gx[V], mean[V];
#pragma unroll
  for (int i = 0; i < V; ++i) sum_g[i] = sum_gx[i] = mean[i] = 0.f;
  if (p.active) {
#pragma unroll
    for (int i = 0; i < V; ++i) mean[i] = save_mean[p.first_channel + i];
#pragma unroll 4  // a few rows' loads in flight
    for (int64_t row = p.row_begin + p.lane; row < p.row_end; row += layout.row_lanes) {
      const int64_t at = row * layout.channels + p.first_channel;
      float d[V], out[V], in[V];
      load_vector(dy + at, d);
      if (kRelu) load_vector(y + at, out);
      load_vector(x + at, in);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float g = masked<kRelu>(d[i], kRelu ? out[i] : 1.f);
        sum_g[i] += g;
        sum_gx[i] += g * (in[i] - mean[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < V; ++i) {
    shared_g[i][threadIdx.x] = sum_g[i];
    shared_gx[i][threadIdx.x] = sum_gx[i];
  }
  reduce_row_lanes(
      layout, p,
      [&](int other) {
#pragma unroll
        for (int i = 0; i < V; ++i) {
          shared_g[i][threadIdx.x] += shared_g[i][other];
          shared_gx[i][threadIdx.x] += shared_gx[i][other];
        }
      },
      [&](int64_t at) {
#pragma unroll
        for (int i = 0; i < V; ++i) {
          partial_g[at + i] = shared_g[i][threadIdx.x];
          partial_gx[at + i] = shared_gx[i][threadIdx.x];
        }
      });
}

// Per channel: dweight = sum(g xhat), dbias = sum(g), and the coefficients of
//   dx = a (g - mean(g)) - (x - mean) k,   a = weight invstd,   k = a invstd^2 sum(g (x - mean)) / rows
// (batch norm's gradient with xhat = (x - mean) invstd written out).
template <typename P>
__global__ void __launch_bounds__(kThreads)
    gradient_sums_finish_kernel(BnLayout layout, const float* __restrict__ partial_g,
                                const float* __restrict__ partial_gx,
                                const P* __restrict__ weight,
                                const float* __restrict__ save_invstd, P* __restrict__ dweight,
                                P* __restrict__ dbias, float* __restrict__ coef_a,
                                float* __restrict__ coef_mean_g, float* __restrict__ coef_k) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t channel = static_cast<int64_t>(blockIdx.x) * kFinishChannels + threadIdx.x / kWarpSize;
  if (channel >= layout.channels) return;  // a whole warp: the shuffles below stay full
  float sum_g = 0.f, sum_gx = 0.f;
  for (int64_t first = lane; first < layout.row_blocks; first += kWarpSize * kPartialsInFlight) {
    float part_g[kPartialsInFlight], part_gx[kPartialsInFlight];
#pragma unroll
    for (int k = 0; k < kPartialsInFlight; ++k) {
      const int64_t block = first + k * kWarpSize;
      part_g[k] = block < layout.row_blocks ? partial_g[block * layout.channels + channel] : 0.f;
      part_gx[k] = block < layout.row_blocks ? partial_gx[block * layout.channels + channel] : 0.f;
    }
#pragma unroll
    for (int k = 0; k < kPartialsInFlight; ++k) {
      sum_g += part_g[k];
      sum_gx += part_gx[k];
    }
  }
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    sum_g += __shfl_down_sync(0xffffffffu, sum_g, offset);
    sum_gx += __shfl_down_sync(0xffffffffu, sum_gx, offset);
  }
  if (lane != 0) return;
  const float invstd = save_invstd[channel], rows = static_cast<float>(layout.rows);
  const float a = to_float(weight[channel]) * invstd;
  dweight[channel] = from_float<P>(sum_gx * invstd);
  dbias[channel] = from_float<P>(sum_g);
  coef_a[channel] = a;
  coef_mean_g[channel] = sum_g / rows;
  coef_k[channel] = a * invstd * invstd * sum_gx / rows;
}

// dx = a (g - mean(g)) - (x - mean) k per element, and dresidual = g.
template <typename T, bool kRelu, bool kResidual>
__global__ void __launch_bounds__(kThreads)
    input_gradient_kernel(BnLayout layout, const T* __restrict__ dy, const T* __restrict__ y,
                          const T* __restrict__ x, const float* __restrict__ save_mean,
                          const float* __restrict__ coef_a, const float* __restrict__ coef_mean_g,
                          const float* __restrict__ coef_k, T* __restrict__ dx,
                          T* __restrict__ dresidual) {
  constexpr int V = vector_elements<T>();
  const int64_t vectors = layout.rows * layout.channels / V;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors;
       i += step) {
    const int64_t element = i * V;
    const int64_t channel = element % layout.channels;
    float d[V], out[V], in[V], a[V], mean_g[V], mean[V], k[V];
    load_vector(dy + element, d);
    if (kRelu) load_vector(y + element, out);
    load_vector(x + element, in);
    load_floats<V>(coef_a + channel, a);
    load_floats<V>(coef_mean_g + channel, mean_g);
    load_floats<V>(save_mean + channel, mean);
    load_floats<V>(coef_k + channel, k);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float g = masked<kRelu>(d[e], kRelu ? out[e] : 1.f);
      if (kResidual) out[e] = g;
      d[e] = a[e] * (g - mean_g[e]) - (in[e] - mean[e]) * k[e];
    }
    store_vector(dx + element, d);
    if (kResidual) store_vector(dresidual + element, out);
  }
}

// --- The layout.

// bn_layout's arithmetic for a GPU of `sm_count` multiprocessors, where bn_layout_fits holds and
// the limits are in their ranges.
inline BnLayout layout_for(int64_t rows, int64_t channels, KernelDtype dtype, int64_t sm_count,
                           const BnLayoutLimits& limits = {}) {
  BnLayout layout;
  layout.rows = rows;
  layout.channels = channels;
  layout.dtype = dtype;
  layout.vector_elements = kVectorBytes / element_bytes(dtype);
  const int64_t channel_vectors = channels / layout.vector_elements;
  layout.tile_vectors = static_cast<int>(std::min<int64_t>(channel_vectors, limits.tile_vectors));
  layout.channel_tiles =
      static_cast<int>((channel_vectors + layout.tile_vectors - 1) / layout.tile_vectors);
  layout.row_lanes = kThreads / layout.tile_vectors;
  const int64_t rows_per_block_wanted = int64_t{layout.row_lanes} * limits.rows_per_thread;
  const int64_t wanted = (rows + rows_per_block_wanted - 1) / rows_per_block_wanted;
  const int64_t most =
      std::max<int64_t>(1, sm_count * limits.blocks_per_sm / layout.channel_tiles);
  const int64_t blocks = std::clamp<int64_t>(wanted, 1, most);
  layout.rows_per_block = (rows + blocks - 1) / blocks;
  layout.row_blocks = (rows + layout.rows_per_block - 1) / layout.rows_per_block;  // none empty
  // The elementwise passes: enough blocks to fill the GPU, each thread a few vectors.
  const int64_t vectors = rows * channels / layout.vector_elements;
  layout.elementwise_blocks =
      std::clamp<int64_t>((vectors + kThreads * 4 - 1) / (kThreads * 4), 1, sm_count * 16);
  // Two [row_blocks, channels] partials, then up to three per-channel arrays.
  layout.workspace_floats = 2 * layout.row_blocks * channels + 3 * channels;
  return layout;
}

// --- The passes, in launch order.

inline dim3 partial_grid(const BnLayout& layout) {
  return dim3(static_cast<unsigned>(layout.row_blocks),
              static_cast<unsigned>(layout.channel_tiles));
}

inline unsigned elementwise_grid(const BnLayout& layout) {
  return static_cast<unsigned>(layout.elementwise_blocks);
}

inline unsigned finish_blocks(const BnLayout& layout) {
  return static_cast<unsigned>((layout.channels + kFinishChannels - 1) / kFinishChannels);
}

// Calls f with std::true_type or std::false_type: a runtime flag as a kernel's template argument.
template <typename F>
void with_flag(bool flag, F&& f) {
  if (flag)
    f(std::true_type{});
  else
    f(std::false_type{});
}

// A forward's kernels, each started as launch(kernel, grid, kernel's arguments...), with
// kThreads threads a block: launch_bn_forward's on a stream, the emulation's on the CPU.
template <typename Launch>
void forward_passes(const BnLayout& layout, const BnForwardArgs& args, Launch&& launch) {
  float* partial_mean = args.workspace;
  float* partial_m2 = partial_mean + layout.row_blocks * layout.channels;
  float* scale = partial_m2 + layout.row_blocks * layout.channels;
  float* shift = scale + layout.channels;
  with_element_type(layout.dtype, [&](auto element) {
    using T = decltype(element);
    launch(statistics_partial_kernel<T>, partial_grid(layout),
        layout, static_cast<const T*>(args.x), partial_mean, partial_m2);
  });
  with_element_type(args.param_dtype, [&](auto element) {
    using P = decltype(element);
    launch(statistics_finish_kernel<P>, finish_blocks(layout),
        layout, partial_mean, partial_m2, static_cast<const P*>(args.weight),
        static_cast<const P*>(args.bias), static_cast<P*>(args.running_mean),
        static_cast<P*>(args.running_var), args.momentum, args.eps, args.save_mean,
        args.save_invstd, scale, shift, args.batches_tracked, args.batches_tracked_type);
  });
  with_element_type(layout.dtype, [&](auto element) {
    using T = decltype(element);
    with_flag(args.relu, [&](auto relu) {
      with_flag(args.residual != nullptr, [&](auto residual) {
        launch(normalise_kernel<T, relu, residual>, elementwise_grid(layout),
            layout, static_cast<const T*>(args.x), static_cast<const T*>(args.residual),
            static_cast<T*>(args.y), scale, shift);
      });
    });
  });
}

// A backward's kernels, likewise.
template <typename Launch>
void backward_passes(const BnLayout& layout, const BnBackwardArgs& args, Launch&& launch) {
  float* partial_g = args.workspace;
  float* partial_gx = partial_g + layout.row_blocks * layout.channels;
  float* coef_a = partial_gx + layout.row_blocks * layout.channels;
  float* coef_mean_g = coef_a + layout.channels;
  float* coef_k = coef_mean_g + layout.channels;
  with_element_type(layout.dtype, [&](auto element) {
    using T = decltype(element);
    const auto dy = static_cast<const T*>(args.dy), y = static_cast<const T*>(args.y),
               x = static_cast<const T*>(args.x);
    with_flag(args.relu, [&](auto relu) {
      launch(gradient_sums_partial_kernel<T, relu>, partial_grid(layout),
          layout, dy, y, x, args.save_mean, partial_g, partial_gx);
    });
  });
  with_element_type(args.param_dtype, [&](auto element) {
    using P = decltype(element);
    launch(gradient_sums_finish_kernel<P>, finish_blocks(layout),
        layout, partial_g, partial_gx, static_cast<const P*>(args.weight), args.save_invstd,
        static_cast<P*>(args.dweight), static_cast<P*>(args.dbias), coef_a, coef_mean_g, coef_k);
  });
  with_element_type(layout.dtype, [&](auto element) {
    using T = decltype(element);
    with_flag(args.relu, [&](auto relu) {
      with_flag(args.dresidual != nullptr, [&](auto residual) {
        launch(input_gradient_kernel<T, relu, residual>, elementwise_grid(layout),
            layout, static_cast<const T*>(args.dy), static_cast<const T*>(args.y),
            static_cast<const T*>(args.x), args.save_mean, coef_a, coef_mean_g, coef_k,
            static_cast<T*>(args.dx), static_cast<T*>(args.dresidual));
      });
    });
  });
}

}  // namespace hpc_train::bn_kernels

// Batch norm in training mode with the ReLU and the residual add that follow it in a ResNet,
// as kernels of ours (src/model/fused_batch_norm.cu) on channels-last activations:
//
//   forward    y = relu(batch_norm(x) + residual)   (the ReLU and the residual each optional)
//   backward   dx, dweight, dbias and dresidual from dy, with the ReLU's mask read from y
//
// Note [Fused batch norm]
// LibTorch runs a ResNet's `relu(bn(conv(x)) + shortcut)` as batch norm's two channels-last
// kernels (statistics, then normalise), an add and a ReLU, each a pass over the activations, and
// the same again backward. These passes were a large share of resnet18's kernel time, the
// statistics kernel alone reading far below the memory's bandwidth. Here one pass computes the
// statistics (Welford per thread, Chan's merge between threads and blocks), a small kernel with a
// warp per channel finishes them (running statistics, scale and shift, and the batch counted in
// num_batches_tracked), and one pass writes y; backward is one pass of per-channel sums, a warp
// per channel to finish them, and one pass that writes dx (and dresidual). With them resnet18's
// step got faster, and under ncu they (batch norm, ReLU and add together) take less of its kernel
// time than LibTorch's four batch-norm kernels alone (bench/results-notes.md, Note [Fused batch
// norm]). The activations are [rows = N x H x W, channels], channels-last, read 16 bytes at a
// time, all arithmetic in fp32. Blocks write partial results and fixed threads merge them in a
// fixed order: no atomics, so the same inputs give the same bits (graph replays equal eager steps,
// runs repeat). Nothing reads back to the host: the kernels can be captured.
//
// Torch-free: raw device pointers and sizes. Needs the CUDA runtime's headers, so only
// GPU-build code includes it; batch_norm_act.h is the model's side.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "hpc_train/runtime/kernel_dtype.h"

namespace hpc_train {

// How the kernels split [rows, channels]: a block covers `tile_vectors` 16-byte vectors of
// channels and `row_lanes` rows at a time, over `rows_per_block` rows; `row_blocks` x
// `channel_tiles` blocks write partial results.
struct BnLayout {
  int64_t rows = 0;
  int64_t channels = 0;
  KernelDtype dtype = KernelDtype::kFloat32;  // of the activations
  int vector_elements = 0;            // channels per 16-byte vector
  int tile_vectors = 0;
  int row_lanes = 0;
  int channel_tiles = 0;
  int64_t row_blocks = 0;
  int64_t rows_per_block = 0;
  int64_t elementwise_blocks = 0;
  int64_t workspace_floats = 0;  // the float workspace either pass needs
};

// What a layout may use: bn_layout fits the shape to the GPU within these. The defaults are what
// the step runs; bench/bn_layout_sweep times others against them.
struct BnLayoutLimits {
  int tile_vectors = 256;     // channel vectors a block covers, at most (1 to 256)
  int rows_per_thread = 16;   // a partial pass's thread at least, before the layout adds blocks
  int blocks_per_sm = 4;      // a partial pass's blocks per multiprocessor, at most
};

// Whether the kernels take activations of this shape and dtype: channels a multiple of the
// vector width (8 at 16 bits, 4 at 32) and more than one row (batch norm's own requirement).
bool bn_layout_fits(int64_t rows, int64_t channels, KernelDtype dtype);
// The layout for the current device. Throws Error where bn_layout_fits says no, or the limits
// are out of their ranges.
BnLayout bn_layout(int64_t rows, int64_t channels, KernelDtype dtype,
                   const BnLayoutLimits& limits = {});

// The element type of BatchNorm's num_batches_tracked: int64 as LibTorch makes it, or a
// floating type where Module::to cast it with the parameters (models.cpp).
enum class CounterType : int32_t { kInt64, kFloat32, kFloat16, kBFloat16 };

struct BnForwardArgs {
  const void* x = nullptr;          // [rows, channels], layout.dtype
  const void* residual = nullptr;   // the same, or null: none
  void* y = nullptr;                // the same
  bool relu = true;
  KernelDtype param_dtype = KernelDtype::kFloat32;  // of weight, bias and the running statistics
  const void* weight = nullptr;     // [channels]
  const void* bias = nullptr;
  void* running_mean = nullptr;     // updated: (1 - momentum) old + momentum batch
  void* running_var = nullptr;      // ... with the batch's unbiased variance
  float momentum = 0.1f;
  float eps = 1e-5f;
  float* save_mean = nullptr;       // [channels] out: the batch's mean ...
  float* save_invstd = nullptr;     // ... and 1 / sqrt(biased variance + eps), for backward
  float* workspace = nullptr;       // layout.workspace_floats
  // num_batches_tracked, advanced by one in the statistics' finishing kernel: a launch of its
  // own per batch norm would cost more than the count (null: the caller counts).
  void* batches_tracked = nullptr;
  CounterType batches_tracked_type = CounterType::kInt64;
};
void launch_bn_forward(const BnLayout& layout, const BnForwardArgs& args, cudaStream_t stream);

struct BnBackwardArgs {
  const void* dy = nullptr;         // [rows, channels], layout.dtype
  const void* y = nullptr;          // the forward's output (the ReLU's mask); unused without relu
  const void* x = nullptr;          // the forward's input
  bool relu = true;
  KernelDtype param_dtype = KernelDtype::kFloat32;
  const void* weight = nullptr;     // [channels]
  const float* save_mean = nullptr;
  const float* save_invstd = nullptr;
  void* dx = nullptr;               // [rows, channels] out
  void* dresidual = nullptr;        // out, or null where the forward had no residual
  void* dweight = nullptr;          // [channels] out, param_dtype
  void* dbias = nullptr;
  float* workspace = nullptr;       // layout.workspace_floats
};
void launch_bn_backward(const BnLayout& layout, const BnBackwardArgs& args, cudaStream_t stream);

}  // namespace hpc_train

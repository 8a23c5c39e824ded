// What one thread of the input kernel does (input_kernel.cu; Note [One input kernel] in
// device_input.cpp), as a function that compiles for the GPU and for the host: the kernel calls
// it once per element of the batch, and test_device_input calls it over every element on the
// CPU against DeviceInput's LibTorch ops.
//
// One element of the model's input: sample b's channel c at (h, w) is the uint8 pixel of its
// source image (a row of the resident split, or of the staged batch), moved by the sample's crop
// and flip (zero where the crop reaches into the padding), normalised as (x/255 - mean) / std in
// fp32 and rounded once to the model dtype. The element that starts a sample also copies its
// label.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define HPC_TRAIN_INPUT_FUNCTION __host__ __device__ __forceinline__
#else
#define HPC_TRAIN_INPUT_FUNCTION inline
#endif

namespace hpc_train {

struct InputBatchArgs {
  int64_t batch = 0, channels = 0, height = 0, width = 0;
  const uint8_t* images = nullptr;      // [source rows, C, H, W] NCHW
  const int64_t* source_row = nullptr;  // [batch]: sample b's row of `images`; null: row b
  const int64_t* source_labels = nullptr;  // indexed by the row
  // [batch] each, the window's top row and left column in the padded image and the flip
  // (FieldRow's draws); null: no crop and no flip.
  const int64_t* crop_top = nullptr;
  const int64_t* crop_left = nullptr;
  const int64_t* flip = nullptr;
  int64_t crop_padding = 0;
  const float* mean = nullptr;  // [C]
  const float* std = nullptr;
  void* input = nullptr;        // [batch, C, H, W], the model dtype, at input_stride
  int64_t input_stride[4] = {0, 0, 0, 0};
  int64_t* labels = nullptr;    // [batch]
};

HPC_TRAIN_INPUT_FUNCTION int64_t input_elements(const InputBatchArgs& a) {
  return a.batch * a.channels * a.height * a.width;
}

// Element `element` in NCHW order. `Convert::from_float<T>` rounds to nearest even, as
// LibTorch's casts. The arithmetic is LibTorch's on the GPU, op for op: its division by the
// scalar 255 is a product with the float 1/255, then a subtraction and a true division by
// the channel's std.
template <typename T, typename Convert>
HPC_TRAIN_INPUT_FUNCTION void input_element(const InputBatchArgs& a, int64_t element) {
  const int64_t w = element % a.width;
  const int64_t h = (element / a.width) % a.height;
  const int64_t c = (element / (a.width * a.height)) % a.channels;
  const int64_t b = element / (a.width * a.height * a.channels);
  const int64_t row = a.source_row ? a.source_row[b] : b;
  int64_t source_h = h, source_w = w;
  bool inside = true;
  if (a.crop_top) {
    source_h = h + a.crop_top[b] - a.crop_padding;
    source_w = (a.flip[b] ? a.width - 1 - w : w) + a.crop_left[b] - a.crop_padding;
    inside = source_h >= 0 && source_h < a.height && source_w >= 0 && source_w < a.width;
  }
  const float pixel =
      inside ? static_cast<float>(a.images[((row * a.channels + c) * a.height + source_h) * a.width + source_w])
             : 0.0f;
  // Each operation rounded on its own, as LibTorch's separate kernels do: no fused multiply-add.
#ifdef __CUDA_ARCH__
  const float scaled = __fmul_rn(pixel, 1.0f / 255.0f);
#else
  const float scaled = pixel * (1.0f / 255.0f);
#endif
  const float value = (scaled - a.mean[c]) / a.std[c];
  static_cast<T*>(a.input)[b * a.input_stride[0] + c * a.input_stride[1] + h * a.input_stride[2] +
                           w * a.input_stride[3]] = Convert::template from_float<T>(value);
  if (c == 0 && h == 0 && w == 0) a.labels[b] = a.source_labels[row];
}

}  // namespace hpc_train

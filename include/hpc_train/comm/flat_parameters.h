// Flat parameter storage: all parameters of a model live in one contiguous buffer, and all
// their gradients in another, laid out bucket by bucket (Note [Bucket layout] in buckets.h), so
// that one collective covers a bucket and one optimizer update covers many parameters, without
// copies.
//
// Note [Flat parameter storage]
// Each parameter's data is re-pointed (`set_data`) at a view of `values()`. Its gradient reaches
// `grads()` in two moves. Backward leaves it where autograd made it: with `.grad` undefined,
// LibTorch's AccumulateGrad takes the new gradient tensor itself as `.grad`, without a kernel
// (and adds into it in place on the later micro-steps of an accumulation window). Once all of a
// bucket's gradients are there, `collect_grads` adds them into the bucket's slots (zero since
// `zero_grads`) in one multi-tensor add, `_foreach_add_`, which on the GPU is a kernel per 64
// tensors or 320 chunks of 64 Ki elements (one for most buckets), and lets them go, so that the
// next backward takes fresh tensors again. `.grad` used to be a view of `grads()`, so that
// autograd accumulated straight into the flat buffer; but that is an add kernel per parameter
// per backward: 62 in resnet18's step, 10 in simple_cnn's, where they were a noticeable share of
// the step's kernel time (bench/results-notes.md, Note [Flat parameter storage]). Padding
// elements stay zero in both buffers.
//
// The *logical* layout is the parameters' concatenation in model order, without padding, each
// parameter's elements in PyTorch's (contiguous) order: it does not depend on buckets, world size
// or memory format, so it is what checkpoints store and what survives a re-layout.
//
// Note [Channels-last weights]
// With channels-last activations (--channels-last on a GPU), cuDNN wants the convolution weights
// channels-last too. Stored contiguous [O, I, kH, kW], every resnet18 step copied each weight to
// NHWC before its convolution and added its NHWC gradient back through a strided add
// (bench/kernel_profile.sh: 34 copies and 17 strided adds a step). So, when asked, a 4-D
// parameter's slot holds its elements in [O, kH, kW, I] order and the parameter is that storage
// seen through a permutation: shape [O, I, kH, kW], channels-last strides, as PyTorch's
// model.to(memory_format=torch.channels_last) gives. Its slot in the gradient buffer is seen
// with the same strides, as autograd's gradient for it is, so collecting it needs no copy. The
// slot's size and place are unchanged: buckets, collectives and the optimizer, which see flat
// elements, do not know; to_logical and from_logical translate, so checkpoints and weight files
// keep PyTorch's order. The trainer asks for it whenever the activations are channels-last. A
// one-channel batch is NCHW and NHWC at once, and LibTorch's convolution then runs NHWC because
// the weights are: the whole network does. With channels-last weights resnet18 on CIFAR got
// faster, while simple_cnn on Fashion-MNIST got slower, its LibTorch max pooling slower in NHWC
// (bench/results-notes.md, Note [Channels-last weights]), so it then stayed NCHW (one-channel
// images kept contiguous weights), with cuDNN converting around its convolutions. Its pooling now
// runs as a kernel of ours in NHWC (Note [Fused pooling] in pool_bias_relu.h).
//
// Note [Gradient precision]
// With an fp16 or bf16 model, the gradients need not stay in 16 bits between backward and the
// optimizer (DeepSpeed's data_types.grad_accum_dtype and communication_data_type):
//  - accumulate_fp32 (--grad-accum-dtype fp32): the micro-steps of an accumulation window add up
//    in fp32. Left to autograd, they add up in the parameters' 16-bit `.grad`, and every add
//    rounds the running sum to 8 (bf16) or 11 (fp16) significant bits, at the scale of the sum:
//    with 8 micro-steps the later ones lose most of their low bits. Instead every backward's
//    gradients are collected (added) into an fp32 buffer as soon as their bucket is complete,
//    inside the window too, and `.grad` starts afresh each micro-step.
//  - reduce_fp32 (--comm-dtype fp32): grads() is fp32: the collectives sum fp32 (each rank's
//    16-bit or fp32 sum, as above), and the optimizer reads the fp32 sum (at ZeRO 2 the reducer's
//    partition is fp32 too), so the ranks' gradients are not rounded to 16 bits once more.
// Which buffer: accumulate and reduce in fp32: grads() (fp32) takes every micro-step. Accumulate
// in fp32, reduce in the model's dtype: a separate fp32 accumulation() takes them, and at the last
// micro-step finish_accumulation rounds a bucket's sum once into grads() for its collective.
// Reduce in fp32 only: autograd adds the micro-steps up in `.grad`, and the last one is collected
// into the fp32 grads(). Memory, per parameter: grads() costs 4 bytes instead of 2 with
// reduce_fp32 (and the ZeRO-2 partition 4/N instead of 2/N); a separate accumulation() costs 4
// more; gradient_bytes() counts both. In an fp32 model both are what happens anyway: nothing
// changes, bit for bit.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hpc_train/comm/buckets.h"

namespace hpc_train {

// Note [Gradient precision]. Each is a no-op for an fp32 model.
struct GradientPrecision {
  bool accumulate_fp32 = false;  // the micro-steps' gradients add up in fp32
  bool reduce_fp32 = false;      // grads() is fp32: what the collectives sum, the optimizer reads
};

class FlatParameters {
 public:
  FlatParameters() = default;
  // Moves the parameters (one dtype, one device) into flat buffers laid out by `layout`; with
  // `channels_last_weights`, 4-D parameters channels-last (Note [Channels-last weights]).
  FlatParameters(std::vector<std::string> names, std::vector<at::Tensor> parameters,
                 BucketLayout layout, bool channels_last_weights = false);

  // Note [Gradient precision]: reallocates grads() (zeroed) in the dtype `precision` asks for,
  // with an fp32 accumulation() where it is needed. The reducer applies its options here. With
  // `full_buffer` false there is neither (ZeRO-2 across ranks, Note [Partitioned gradients] in
  // reducer.h): grads() is undefined, and the reducer takes each bucket's gradients into a
  // staging buffer of its own (collect_grads_into).
  void set_gradient_storage(GradientPrecision precision, bool full_buffer = true);
  // Whether every micro-step's gradients are collected (into fp32), not only the last one's.
  bool collects_every_micro_step() const { return accumulates_fp32_; }

  at::Tensor& values() { return values_; }
  at::Tensor& grads() { return grads_; }
  const at::Tensor& values() const { return values_; }
  const at::Tensor& grads() const { return grads_; }
  const BucketLayout& layout() const { return layout_; }
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  int64_t numel() const { return logical_numel_; }  // parameters' elements, no padding

  // A bucket's elements (padding included) of a flat-layout tensor.
  at::Tensor bucket_view(const at::Tensor& flat, size_t bucket) const;

  // Flat layout <-> logical layout (any dtype; the result is a new tensor).
  at::Tensor to_logical(const at::Tensor& flat) const;
  at::Tensor from_logical(const at::Tensor& logical) const;

  // Moves values and gradients into `layout`'s order (e.g. buckets rebuilt after the first step).
  void relayout(BucketLayout layout);

  // Adds the gradients that backward left in `bucket`'s parameters' `.grad` into their slots of
  // `grads()` (of the fp32 accumulation buffer, when there is one) and resets those `.grad` to
  // undefined (Note [Flat parameter storage]). Parameters without a gradient (unused this step)
  // are skipped: their slots keep what they hold.
  void collect_grads(size_t bucket);
  // The same into `staging` instead (Note [Partitioned gradients] in reducer.h): its first
  // padded_numel elements are zeroed, so that gaps and padding are zero, and take `bucket`'s
  // gradients where its slots are in the bucket; returns that bucket-shaped view of `staging`.
  at::Tensor collect_grads_into(size_t bucket, const at::Tensor& staging);
  // Parameter `i`'s gradient from `.grad`, 1-D in its slot's element order ([O, kH, kW, I] for a
  // channels-last weight; a view where autograd's strides allow), with `.grad` reset to
  // undefined; undefined where backward left none. For a bucket too large to stage whole.
  at::Tensor take_grad_in_slot_order(size_t i);
  // After the last micro-step's collect_grads: `grads()` holds the bucket's sum over the window.
  // With a separate fp32 accumulation buffer, its bucket is rounded into grads() (Note [Gradient
  // precision]); otherwise nothing is left to do.
  void finish_accumulation(size_t bucket);
  // Zeroes `grads()` (and the accumulation buffer) and drops any gradient not collected: the state
  // before a backward.
  void zero_grads();
  // Bytes of the gradient buffers: grads() (when kept), and the fp32 accumulation buffer when
  // separate.
  int64_t gradient_bytes() const;

 private:
  void point_parameters_at_buffers();
  // Parameter i's elements of a flat-layout tensor, in its shape and memory format; of a tensor
  // holding the flat layout from element `first_element` on, with that offset.
  at::Tensor parameter_view(const at::Tensor& flat, size_t i, int64_t first_element = 0) const;
  // Adds the `.grad`s of `bucket`'s parameters into their slots of `sum` (which holds the flat
  // layout from `first_element` on) and lets them go.
  void add_grads(size_t bucket, const at::Tensor& sum, int64_t first_element);

  std::vector<std::string> names_;
  std::vector<at::Tensor> parameters_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<bool> channels_last_;  // per parameter: stored [O, kH, kW, I]
  BucketLayout layout_;
  int64_t logical_numel_ = 0;
  at::Tensor values_;
  at::Tensor grads_;
  // Note [Gradient precision]: an fp32 sum of the micro-steps apart from grads(), or undefined.
  at::Tensor accumulation_;
  bool accumulates_fp32_ = false;  // accumulate_fp32 in a 16-bit model
};

}  // namespace hpc_train

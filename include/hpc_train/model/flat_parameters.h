// Flat parameter storage: all parameters of a model live in one contiguous buffer, and all
// their gradients in another, laid out bucket by bucket (Note [Bucket layout] in buckets.h), so
// that one collective covers a bucket and one optimizer update covers many parameters, without
// copies.
//
// Note [Flat parameter storage]
// Each parameter's data is re-pointed (`set_data`) at a view of `values()`, and its `.grad` is
// set to the matching view of `grads()`. Autograd accumulates into an existing `.grad` in place,
// so backward writes straight into the flat gradient buffer, as long as nobody replaces `.grad`:
// gradients are cleared with `zero_grads()`, never by resetting them to undefined. Padding
// elements stay zero in both buffers.
//
// The *logical* layout is the parameters' concatenation in model order, without padding: it does
// not depend on buckets or world size, so it is what checkpoints store and what survives a
// re-layout.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hpc_train/comm/buckets.h"

namespace hpc_train {

class FlatParameters {
 public:
  FlatParameters() = default;
  // Moves the parameters (one dtype, one device) into flat buffers laid out by `layout`.
  FlatParameters(std::vector<std::string> names, std::vector<at::Tensor> parameters,
                 BucketLayout layout);

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

  void zero_grads();

 private:
  void point_parameters_at_buffers();

  std::vector<std::string> names_;
  std::vector<at::Tensor> parameters_;
  std::vector<std::vector<int64_t>> shapes_;
  BucketLayout layout_;
  int64_t logical_numel_ = 0;
  at::Tensor values_;
  at::Tensor grads_;
};

}  // namespace hpc_train

#include "hpc_train/comm/flat_parameters.h"

#include <ATen/ATen.h>

#include "hpc_train/error.h"

namespace hpc_train {

FlatParameters::FlatParameters(std::vector<std::string> names, std::vector<at::Tensor> parameters,
                               BucketLayout layout, bool channels_last_weights)
    : names_(std::move(names)), parameters_(std::move(parameters)), layout_(std::move(layout)) {
  if (names_.size() != parameters_.size() || parameters_.size() != layout_.slots.size())
    throw Error("FlatParameters: names, parameters and layout differ in count");
  if (parameters_.empty()) throw Error("FlatParameters: the model has no parameters");
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const at::Tensor& p = parameters_[i];
    if (p.scalar_type() != parameters_[0].scalar_type() || p.device() != parameters_[0].device())
      throw Error("FlatParameters: parameter " + names_[i] + " differs in dtype or device");
    if (p.numel() != layout_.slots[i].numel)
      throw Error("FlatParameters: the layout's size of " + names_[i] + " is wrong");
    shapes_.push_back(p.sizes().vec());
    channels_last_.push_back(channels_last_weights && p.dim() == 4);
    logical_numel_ += p.numel();
  }
  const at::TensorOptions options = parameters_[0].options().requires_grad(false);
  values_ = at::zeros({layout_.total_numel}, options);
  grads_ = at::empty({layout_.total_numel}, options);
  for (size_t i = 0; i < parameters_.size(); ++i)
    parameter_view(values_, i).copy_(parameters_[i].detach());
  point_parameters_at_buffers();
  zero_grads();  // also drops any .grad the parameters came with, so that backward's are taken
}

// Note [Gradient precision]
void FlatParameters::set_gradient_storage(GradientPrecision precision, bool full_buffer) {
  const at::ScalarType model_dtype = values_.scalar_type();
  if (!full_buffer) {  // Note [Partitioned gradients] in reducer.h
    accumulates_fp32_ = false;
    grads_ = accumulation_ = at::Tensor();
    zero_grads();
    return;
  }
  accumulates_fp32_ = precision.accumulate_fp32 && model_dtype != at::kFloat;
  const at::TensorOptions options = values_.options();
  const at::ScalarType grad_dtype = precision.reduce_fp32 ? at::kFloat : model_dtype;
  // The buffer stays where its dtype does not change (an fp32 model, or 16-bit reduction).
  if (!grads_.defined() || grads_.scalar_type() != grad_dtype)
    grads_ = at::empty({layout_.total_numel}, options.dtype(grad_dtype));
  // fp32 grads() take the fp32 sum themselves; 16-bit ones get it rounded at the window's end.
  accumulation_ = accumulates_fp32_ && grad_dtype != at::kFloat
                      ? at::empty({layout_.total_numel}, options.dtype(at::kFloat))
                      : at::Tensor();
  zero_grads();
}

at::Tensor FlatParameters::parameter_view(const at::Tensor& flat, size_t i,
                                          int64_t first_element) const {
  const BucketLayout::Slot& slot = layout_.slots[i];
  const at::Tensor elements = flat.narrow(0, slot.offset - first_element, slot.numel);
  if (!channels_last_[i]) return elements.view(shapes_[i]);
  const std::vector<int64_t>& shape = shapes_[i];  // [O, I, kH, kW]
  return elements.view({shape[0], shape[2], shape[3], shape[1]}).permute({0, 3, 1, 2});
}

// See Note [Flat parameter storage].
void FlatParameters::point_parameters_at_buffers() {
  for (size_t i = 0; i < parameters_.size(); ++i)
    parameters_[i].set_data(parameter_view(values_, i));
}

at::Tensor FlatParameters::bucket_view(const at::Tensor& flat, size_t bucket) const {
  const BucketLayout::Span& span = layout_.spans.at(bucket);
  return flat.narrow(0, span.offset, span.padded_numel);
}

at::Tensor FlatParameters::to_logical(const at::Tensor& flat) const {
  std::vector<at::Tensor> pieces;
  for (size_t i = 0; i < parameters_.size(); ++i)
    pieces.push_back(parameter_view(flat, i).reshape({-1}));  // PyTorch's order
  return at::cat(pieces);
}

at::Tensor FlatParameters::from_logical(const at::Tensor& logical) const {
  if (logical.numel() != logical_numel_)
    throw Error("FlatParameters: a logical tensor of " + std::to_string(logical.numel()) +
                " elements for a model of " + std::to_string(logical_numel_));
  at::Tensor flat = at::zeros({layout_.total_numel}, logical.options());
  int64_t logical_offset = 0;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const int64_t numel = layout_.slots[i].numel;
    parameter_view(flat, i).copy_(logical.narrow(0, logical_offset, numel).view(shapes_[i]));
    logical_offset += numel;
  }
  return flat;
}

void FlatParameters::relayout(BucketLayout layout) {
  const at::Tensor logical_values = to_logical(values_);
  const at::Tensor logical_grads = grads_.defined() ? to_logical(grads_) : at::Tensor();
  const at::Tensor logical_accumulation =
      accumulation_.defined() ? to_logical(accumulation_) : at::Tensor();
  layout_ = std::move(layout);
  values_ = from_logical(logical_values);
  if (logical_grads.defined()) grads_ = from_logical(logical_grads);
  if (logical_accumulation.defined()) accumulation_ = from_logical(logical_accumulation);
  point_parameters_at_buffers();
}

void FlatParameters::collect_grads(size_t bucket) {
  if (!grads_.defined())
    throw Error("FlatParameters::collect_grads: no gradient buffer is kept (ZeRO-2 stages them)");
  add_grads(bucket, accumulation_.defined() ? accumulation_ : grads_, 0);
}

at::Tensor FlatParameters::collect_grads_into(size_t bucket, const at::Tensor& staging) {
  const BucketLayout::Span& span = layout_.spans.at(bucket);
  at::Tensor bucket_elements = staging.narrow(0, 0, span.padded_numel);
  bucket_elements.zero_();
  add_grads(bucket, bucket_elements, span.offset);
  return bucket_elements;
}

at::Tensor FlatParameters::take_grad_in_slot_order(size_t i) {
  at::Tensor grad = std::move(parameters_.at(i).mutable_grad());
  parameters_[i].mutable_grad() = at::Tensor();
  if (!grad.defined()) return grad;
  if (channels_last_[i]) grad = grad.permute({0, 2, 3, 1});  // Note [Channels-last weights]
  return grad.reshape({-1});
}

void FlatParameters::add_grads(size_t bucket, const at::Tensor& sum, int64_t first_element) {
  // Note [Gradient precision]: 16-bit gradients added into fp32 slots take _foreach_add_'s
  // per-tensor path (its multi-tensor kernels want one dtype), each add in fp32.
  std::vector<at::Tensor> slots;
  std::vector<at::Tensor> gradients;
  for (int i : layout_.buckets.at(bucket).parameters) {
    at::Tensor& grad = parameters_[i].mutable_grad();
    if (!grad.defined()) continue;
    slots.push_back(parameter_view(sum, i, first_element));
    gradients.push_back(std::move(grad));
    grad = at::Tensor();
  }
  if (!slots.empty()) at::_foreach_add_(slots, gradients);
}

void FlatParameters::finish_accumulation(size_t bucket) {
  if (!accumulation_.defined()) return;
  bucket_view(grads_, bucket).copy_(bucket_view(accumulation_, bucket));
}

void FlatParameters::zero_grads() {
  for (at::Tensor& p : parameters_) p.mutable_grad() = at::Tensor();
  if (grads_.defined()) grads_.zero_();
  if (accumulation_.defined()) accumulation_.zero_();
}

int64_t FlatParameters::gradient_bytes() const {
  int64_t bytes = grads_.defined() ? grads_.numel() * grads_.element_size() : 0;
  if (accumulation_.defined()) bytes += accumulation_.numel() * accumulation_.element_size();
  return bytes;
}

}  // namespace hpc_train

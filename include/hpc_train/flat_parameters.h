// Flat parameter storage: all parameters of a model live in one contiguous buffer, and all
// their gradients in another, so that one collective (or one bucket of them) and one optimizer
// update cover many parameters without copies.
//
// Note [Flat parameter storage]
// Each parameter's data is re-pointed (`set_data`) at a view of `values()`, and its `.grad` is
// set to the matching view of `grads()`. Autograd accumulates into an existing `.grad` in place,
// so backward writes straight into the flat gradient buffer, as long as nobody replaces `.grad`:
// gradients are cleared with `zero_grads()`, never by resetting them to undefined.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hpc_train {

struct ParameterSlot {
  std::string name;       // as in the model's named_parameters(), e.g. "conv1.weight"
  int64_t offset = 0;     // first element in the flat buffers
  int64_t numel = 0;
  std::vector<int64_t> shape;
};

class FlatParameters {
 public:
  FlatParameters() = default;
  // Moves the parameters (one dtype, one device) into the flat buffers, in the given order.
  FlatParameters(const std::vector<std::string>& names, std::vector<at::Tensor> parameters);

  at::Tensor& values() { return values_; }
  at::Tensor& grads() { return grads_; }
  const at::Tensor& values() const { return values_; }
  const at::Tensor& grads() const { return grads_; }
  const std::vector<ParameterSlot>& slots() const { return slots_; }
  int64_t numel() const { return values_.defined() ? values_.numel() : 0; }

  void zero_grads();

 private:
  at::Tensor values_;
  at::Tensor grads_;
  std::vector<ParameterSlot> slots_;
};

}  // namespace hpc_train

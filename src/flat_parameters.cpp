#include "hpc_train/flat_parameters.h"

#include <ATen/ATen.h>

#include "hpc_train/error.h"

namespace hpc_train {

FlatParameters::FlatParameters(const std::vector<std::string>& names,
                               std::vector<at::Tensor> parameters) {
  if (names.size() != parameters.size()) throw Error("FlatParameters: names and parameters differ in count");
  if (parameters.empty()) throw Error("FlatParameters: the model has no parameters");
  int64_t total = 0;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const at::Tensor& p = parameters[i];
    if (p.scalar_type() != parameters[0].scalar_type() || p.device() != parameters[0].device())
      throw Error("FlatParameters: parameter " + names[i] + " differs in dtype or device");
    slots_.push_back({names[i], total, p.numel(), p.sizes().vec()});
    total += p.numel();
  }
  values_ = at::empty({total}, parameters[0].options().requires_grad(false));
  grads_ = at::zeros({total}, parameters[0].options().requires_grad(false));
  // See Note [Flat parameter storage].
  for (size_t i = 0; i < parameters.size(); ++i) {
    const ParameterSlot& slot = slots_[i];
    at::Tensor value_view = values_.narrow(0, slot.offset, slot.numel).view(slot.shape);
    value_view.copy_(parameters[i].detach());
    parameters[i].set_data(value_view);
    parameters[i].mutable_grad() = grads_.narrow(0, slot.offset, slot.numel).view(slot.shape);
  }
}

void FlatParameters::zero_grads() {
  if (grads_.defined()) grads_.zero_();
}

}  // namespace hpc_train

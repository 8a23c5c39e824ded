#include "hpc_train/train/weight_ema.h"

#include <ATen/ATen.h>

#include <filesystem>

#include "hpc_train/error.h"

namespace hpc_train {

void with_ema_weights(ZeroOptimizer& optimizer, FlatParameters& flat,
                      const std::function<void()>& body) {
  const at::Tensor ema = optimizer.ema_flat();
  if (!ema.defined()) throw Error("with_ema_weights: the optimizer keeps no EMA (--ema-decay 0)");
  const at::Tensor weights = flat.values().clone();
  flat.values().copy_(ema);
  try {
    body();
  } catch (...) {
    flat.values().copy_(weights);
    throw;
  }
  flat.values().copy_(weights);
}

std::string ema_export_path(const std::string& weights_path) {
  std::filesystem::path path(weights_path);
  const std::string extension = path.extension().string();
  path.replace_extension(".ema" + extension);
  return path.string();
}

}  // namespace hpc_train

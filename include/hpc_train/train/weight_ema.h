// The weights' EMA in use (--ema-decay; Note [Weight EMA] in zero_optimizer.h): the optimizer
// keeps it, partitioned; here it stands in for the weights while the trainer evaluates or
// exports it.
#pragma once

#include <functional>
#include <string>

#include "hpc_train/comm/flat_parameters.h"
#include "hpc_train/optim/zero_optimizer.h"

namespace hpc_train {

// Runs `body` with the optimizer's EMA in the model's parameters (`flat`'s values, cast to the
// model dtype), then puts the weights back bit for bit. The optimizer must keep an EMA.
// Collective (the EMA is assembled from every rank's partition).
void with_ema_weights(ZeroOptimizer& optimizer, FlatParameters& flat,
                      const std::function<void()>& body);

// Where --export-weights PATH puts the EMA: PATH with ".ema" before its extension
// (weights.safetensors -> weights.ema.safetensors).
std::string ema_export_path(const std::string& weights_path);

}  // namespace hpc_train

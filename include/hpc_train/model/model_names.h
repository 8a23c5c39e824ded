// The model registry's names, without LibTorch: --help (config.cpp, in hpc_train_core, which
// does not link LibTorch) lists them, and the registry (models.cpp) builds exactly these.
#pragma once

#include <string>
#include <vector>

namespace hpc_train {

// Every name --model takes, in the order --help and docs/models.md list them (models.h describes
// each network).
const std::vector<std::string>& model_names();

// The names joined by ", ", for --help and for the message of an unknown name.
std::string model_names_text();

}  // namespace hpc_train

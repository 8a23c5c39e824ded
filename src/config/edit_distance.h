// The edit distance between two names, for spotting misspelt options, INI keys and DeepSpeed
// keys. Private to config/: the command line and INI reader (config.cpp) suggests the nearest
// name with it, the DeepSpeed reader (deepspeed_config.cpp) tells a misspelt key from an unknown
// one with it.
#pragma once

#include <cstddef>
#include <string>

namespace hpc_train {

// Levenshtein distance: the fewest single-character insertions, deletions and substitutions
// that turn `from` into `to`.
size_t edit_distance(const std::string& from, const std::string& to);

}  // namespace hpc_train

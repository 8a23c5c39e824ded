// --init-weights FILE.safetensors: the model starts from a PyTorch state_dict saved with
// safetensors.torch.save_file (names as PyTorch gives them: "conv1.weight",
// "bn1.running_mean", ...) instead of its own initialisation. hpc_train's --export-weights files
// are such files, so they load back.
//
// Strict by default, as load_state_dict(strict=True): every parameter and buffer of the model
// must be in the file with its shape, and the file must hold nothing else; otherwise the run
// stops before training, naming each tensor and both shapes. --init-weights-partial loads the
// tensors whose name and shape match and lists the others (fine-tuning with a new head: the
// file's head has another shape and stays behind, the model's keeps its initialisation).
//
// Each tensor is converted from its dtype in the file (F64, F32, F16, BF16, the integer types,
// BOOL) to the model's; an integer buffer (num_batches_tracked) takes floating-point values
// only when they are whole numbers (a 16-bit run's export stores that count as F32). Every
// rank loads the file, before the broadcast of rank 0's parameters and buffers (trainer_setup.cpp),
// so a file that does not fit stops every rank alike.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hpc_train/model/models.h"

namespace hpc_train {

struct NamedShape {
  std::string name;
  std::vector<int64_t> shape;
};

// How a file's tensors meet a model's state_dict, by name.
struct WeightsMatch {
  struct Mismatch {
    std::string name;
    std::vector<int64_t> file_shape;
    std::vector<int64_t> model_shape;
  };
  std::vector<std::string> matched;    // same name, same shape: loaded (model order)
  std::vector<NamedShape> missing;     // the model's, not in the file (model order)
  std::vector<NamedShape> unexpected;  // the file's, not in the model (file order)
  std::vector<Mismatch> mismatched;    // in both, shapes differ (model order)

  bool complete() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
};

// Pure: matches `file` against `model` by name.
WeightsMatch match_weights(const std::vector<NamedShape>& file,
                           const std::vector<NamedShape>& model);

// "missing fc.bias [10]; unexpected head.weight [5, 512]; fc.weight is [5, 512] in the file,
// [10, 512] in the model": every tensor that did not match, at most `max_listed` of each kind
// (then "and N more").
std::string describe_unmatched(const WeightsMatch& match, size_t max_listed = 8);

// The log line of a load from `path`: "Initial weights: all 8 tensors from FILE", or for a
// partial load how many matched and every tensor left (what a fine-tuning run keeps of its own
// initialisation).
std::string describe_weights_loaded(const WeightsMatch& match, const std::string& path);

// Copies the tensors of the safetensors file `path` into `model`'s parameters and buffers
// (without recording gradients). `partial`: --init-weights-partial; `model_name`: how messages
// name the model (--model as given). Throws DataError naming the file, before anything is
// copied: a file that is not safetensors, one that does not fit the model when strict (every
// unmatched tensor named with its shapes), one of which no tensor fits when partial, a tensor
// of a dtype that cannot be converted. Returns the match (what a partial load left).
WeightsMatch load_initial_weights(const std::string& path, bool partial, TrainableModel& model,
                                  const std::string& model_name);

}  // namespace hpc_train

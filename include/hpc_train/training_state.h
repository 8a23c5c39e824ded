// Between the trainer's tensors and a checkpoint's plain structs (checkpoint.h): the model's
// state_dict, the optimizer state, the CPU random state, and what a resume takes back from a
// file. The trainer decides when; this unit knows how.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hpc_train/checkpoint.h"
#include "hpc_train/dataset_file.h"
#include "hpc_train/zero_optimizer.h"

namespace hpc_train {

// The model's state_dict (parameters, then buffers) in fp32 on the host, as checkpoints and
// weight exports hold it; integral buffers (num_batches_tracked) stay int64.
std::vector<CheckpointTensor> model_state(const torch::nn::Module& model);

// What a weights export needs (write_weights_safetensors): the model's name, its input and its
// state_dict at `global_step`. Not collective.
Checkpoint model_checkpoint(const std::string& model_name, const DatasetInfo& input,
                            const torch::nn::Module& model, int64_t global_step);

// Adds the optimizer state (gathered, logical layout) and the CPU generator's state.
void add_optimizer_and_rng_state(Checkpoint& checkpoint, const FullOptimizerState& state);

// For a resume from `checkpoint` (read from `path`): throws DataError naming the file when it
// holds another model or input (check_checkpoint_fits), else copies its buffers into `model`
// (the parameters follow the master weights, ZeroOptimizer::load_full_state) and restores the
// CPU generator. Returns the optimizer state on `device`.
FullOptimizerState restore_model_and_rng(const Checkpoint& checkpoint, const std::string& path,
                                         const std::string& model_name, const DatasetInfo& input,
                                         torch::nn::Module& model, int64_t flat_numel,
                                         const torch::Device& device);

// "fp16, dynamic, scale 1024", "fp16, fixed scale 128", "bf16, no scaling".
std::string describe_loss_scaling(const std::string& precision, bool scaled, bool dynamic,
                                  double scale);

}  // namespace hpc_train

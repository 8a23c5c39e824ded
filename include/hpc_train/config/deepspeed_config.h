// DeepSpeed's ds_config.json, read and mapped onto TrainConfig, so that people who ran
// PyTorch + DeepSpeed bring their configuration along (--deepspeed-config FILE).
//
// Mapped keys: train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps,
// optimizer {type Adam|AdamW, params {lr, betas, eps, weight_decay, adam_w_mode}},
// fp16 {enabled, loss_scale, initial_scale_power, loss_scale_window, hysteresis,
// min_loss_scale}, bf16 {enabled}, data_types {grad_accum_dtype}, communication_data_type
// (fp32 or the model's dtype), zero_optimization {stage, reduce_bucket_size,
// allgather_bucket_size, overlap_comm, contiguous_gradients, reduce_scatter},
// gradient_clipping, steps_per_print, scheduler {type WarmupLR|WarmupCosineLR, params},
// tensorboard and csv_monitor {enabled, output_path, job_name}.
// A key hpc_train does not implement is a warning that names it, unless ignoring it would change
// what the run computes (then an error; a warning with allow_unknown_keys): see Note [Keys
// hpc_train does not implement] in deepspeed_config.cpp. "auto" (Hugging Face's templates)
// leaves a value to the command line, INI file or default. The batch identity train_batch_size
// = micro-batch x grad_accum x world_size is checked and the missing value derived as DeepSpeed
// does.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "hpc_train/config/config.h"

namespace hpc_train {

// Applies the file at `import.path` to `config` for a job of `world_size` ranks. Values of
// options named in `given_on_command_line` are kept (the command line wins). Returns warnings
// (ignored keys, settings that have no effect here) and what each "auto" resolved to. Throws
// ConfigError naming the file, the key and what would work: a key that changes the result or
// looks misspelt, wrong JSON type, unsupported value (optimizer type, scheduler type, ZeRO
// stage > 2, fp16 and bf16 both enabled), or a batch identity that cannot hold at this world
// size.
std::vector<std::string> apply_deepspeed_config(const DeepSpeedImport& import, int world_size,
                                                const std::set<std::string>& given_on_command_line,
                                                TrainConfig& config);

}  // namespace hpc_train

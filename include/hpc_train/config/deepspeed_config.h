// DeepSpeed's ds_config.json, read and mapped onto TrainConfig, so that people who ran
// PyTorch + DeepSpeed bring their configuration along (--deepspeed-config FILE).
//
// Mapped keys: train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps,
// optimizer {type Adam|AdamW, params {lr, betas, eps, weight_decay, adam_w_mode}},
// fp16 {enabled, loss_scale, initial_scale_power, loss_scale_window, hysteresis,
// min_loss_scale}, bf16 {enabled}, zero_optimization {stage, reduce_bucket_size,
// allgather_bucket_size, overlap_comm, contiguous_gradients, reduce_scatter},
// gradient_clipping, steps_per_print, scheduler {type WarmupLR|WarmupCosineLR, params}.
// A key it does not know is an error that lists the known ones (a warning with
// allow_unknown_keys). The batch identity train_batch_size = micro-batch x grad_accum x
// world_size is checked and the missing value derived as DeepSpeed does.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "hpc_train/config/config.h"

namespace hpc_train {

// Applies the file at `import.path` to `config` for a job of `world_size` ranks. Values of
// options named in `given_on_command_line` are kept (the command line wins). Returns warnings
// (ignored keys with allow_unknown_keys, settings that have no effect here). Throws ConfigError
// naming the file, the key and what would work: unknown key, wrong JSON type, unsupported value
// (optimizer type, scheduler type, ZeRO stage > 2, fp16 and bf16 both enabled), or a batch
// identity that cannot hold at this world size.
std::vector<std::string> apply_deepspeed_config(const DeepSpeedImport& import, int world_size,
                                                const std::set<std::string>& given_on_command_line,
                                                TrainConfig& config);

}  // namespace hpc_train

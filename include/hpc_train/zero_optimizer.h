// The ZeRO optimizer: Adam/AdamW on this rank's partition of fp32 master weights and moments,
// after the reducer has reduced the gradients.
//
//   stage 0  every rank holds the whole optimizer state and updates every parameter
//   stage 1  gradients all-reduced; each rank updates only its partition (its slice of every
//            bucket, Note [Bucket layout]), then the buckets are all-gathered
//   stage 2  as stage 1, but the reducer reduce-scattered the gradients, so each rank only ever
//            holds its partition of the reduced gradients
//
// One step: unscale (fp16) -> overflow check agreed by all ranks (fp16; an overflow skips the
// step everywhere) -> clip by the global norm -> Adam/AdamW on the fp32 master partition ->
// cast to the model dtype -> all-gather. In fp32 the parameters themselves are the master
// weights (no copy); in fp16/bf16 a separate fp32 copy of the partition is kept.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "hpc_train/comm.h"
#include "hpc_train/flat_parameters.h"
#include "hpc_train/optimizer.h"
#include "hpc_train/reducer.h"

namespace hpc_train {

struct ZeroOptions {
  int stage = 0;
  AdamOptions adam;
  double clip_grad = 0.0;       // max global norm; 0 = off
  bool check_overflow = false;  // fp16: look for inf/nan and skip the step on every rank
};

struct StepOutcome {
  bool overflow = false;  // some rank saw inf/nan: nothing was updated
  double grad_norm = 0.0; // global norm of the unscaled gradients (before clipping)
  double gather_ms = 0.0; // time in the all-gather of parameters (stages 1, 2)
};

// The optimizer state in the logical layout (flat_parameters.h), independent of world size and
// buckets: what a checkpoint stores and what survives a re-layout.
struct FullOptimizerState {
  at::Tensor master;      // fp32
  at::Tensor exp_avg;
  at::Tensor exp_avg_sq;
  int64_t steps = 0;
};

class ZeroOptimizer {
 public:
  ZeroOptimizer(FlatParameters& flat, Reducer& reducer, Communicator& comm, ZeroOptions options);

  // Gradients in the flat buffer (stages 0, 1) or the reducer's partition (stage 2) are the sum
  // over ranks of each rank's gradient of loss * loss_scale / (world size * grad_accum)
  // (Note [Gradient averaging]). Collective.
  StepOutcome step(double lr, double loss_scale);

  int64_t steps_taken() const { return steps_; }
  // Bytes of optimizer state on this rank: moments, plus fp32 master weights when separate.
  int64_t state_bytes() const;

  FullOptimizerState gather_full_state();  // collective
  void load_full_state(const FullOptimizerState& state);
  // After flat.relayout() and reducer.reset_buckets(): carries `state` (gathered before) over.
  void relayout(const FullOptimizerState& state) { load_full_state(state); }

 private:
  bool partitioned() const { return options_.stage >= 1; }
  bool separate_master() const;
  at::Tensor gradient_partition();  // fp32 copy or view of this rank's reduced gradients
  // This rank's piece of bucket `b` of a flat-layout tensor, and of a partition tensor.
  at::Tensor own_slice(const at::Tensor& flat, size_t b) const;
  at::Tensor partition_slice(const at::Tensor& partition, size_t b) const;
  at::Tensor assemble_full(const at::Tensor& partition);  // collective, flat layout

  FlatParameters& flat_;
  Reducer& reducer_;
  Communicator& comm_;
  ZeroOptions options_;
  int64_t steps_ = 0;
  at::Tensor master_;  // fp32; partition (stages 1, 2) or whole; undefined when params are fp32 master
  at::Tensor exp_avg_;
  at::Tensor exp_avg_sq_;
};

}  // namespace hpc_train

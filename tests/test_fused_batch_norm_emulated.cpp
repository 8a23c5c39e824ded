// The fused batch-norm kernels (fused_batch_norm_kernels.cuh, Note [Fused batch norm]) compiled
// for the host and run on the CPU under cuda_emulation.h, through the launch sequences that
// launch_bn_forward and launch_bn_backward run on a GPU (forward_passes, backward_passes):
// relu(bn(x) + residual) forward and backward against LibTorch's batch_norm, add and ReLU in
// fp64, with the GPU test's reference and tolerances (batch_norm_reference.h). So the CPU build
// checks the kernels' arithmetic, indexing and the cooperation of a block's threads; what only a
// GPU shows (blocks running at once, memory ordering, speed) stays with test_fused_batch_norm.
// The layouts are those of a GPU of few multiprocessors, which gives every shape several row
// blocks at few rows, so that emulating them stays quick. Fresh random inputs every run (the seed
// is printed; HPC_TRAIN_TEST_SEED=<seed> repeats a run).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "batch_norm_reference.h"
#include "cuda_emulation.h"
#include "hpc_train/model/fused_batch_norm_kernels.cuh"
#include "hpc_train/runtime/kernel_dtype_torch.h"
#include "test_seed.h"

namespace {

using namespace hpc_train;
using namespace hpc_train::testing;

// One forward and one backward of the kernels, as launch_bn_forward and launch_bn_backward run
// them, on the case's inputs: `forwards` forwards first, so that the running statistics and the
// counter advance that many times (the outputs are the last forward's and its backward).
Outputs run_emulated(const Case& c, const Inputs& in, int64_t sm_count, int forwards,
                     int64_t* batches_tracked, const BnLayoutLimits& limits = {}) {
  const int64_t rows = in.x.numel() / c.shape[1];
  const BnLayout layout =
      bn_kernels::layout_for(rows, c.shape[1], *kernel_dtype_of(c.dtype), sm_count, limits);
  const auto like = [](const torch::Tensor& t) {
    return torch::empty_like(t, at::MemoryFormat::ChannelsLast);
  };
  const auto floats = [](int64_t n) { return torch::empty({n}, torch::kFloat); };
  Outputs out;
  out.running_mean = in.running_mean.clone();
  out.running_var = in.running_var.clone();
  out.y = like(in.x);
  const torch::Tensor save_mean = floats(c.shape[1]), save_invstd = floats(c.shape[1]);
  const torch::Tensor workspace = floats(layout.workspace_floats);
  BnForwardArgs forward;
  forward.x = in.x.data_ptr();
  forward.residual = c.residual ? in.residual.data_ptr() : nullptr;
  forward.y = out.y.data_ptr();
  forward.relu = c.relu;
  forward.param_dtype = *kernel_dtype_of(c.param_dtype);
  forward.weight = in.weight.data_ptr();
  forward.bias = in.bias.data_ptr();
  forward.running_mean = out.running_mean.data_ptr();
  forward.running_var = out.running_var.data_ptr();
  forward.save_mean = save_mean.data_ptr<float>();
  forward.save_invstd = save_invstd.data_ptr<float>();
  forward.workspace = workspace.data_ptr<float>();
  forward.batches_tracked = batches_tracked;
  forward.batches_tracked_type = CounterType::kInt64;
  const auto emulated = [](auto kernel, dim3 grid, auto... arguments) {
    emulation::emulate_launch(grid, bn_kernels::kThreads, kernel, arguments...);
  };
  for (int i = 0; i < forwards; ++i) bn_kernels::forward_passes(layout, forward, emulated);

  out.dx = like(in.x);
  if (c.residual) out.dresidual = like(in.x);
  out.dweight = torch::empty_like(in.weight);
  out.dbias = torch::empty_like(in.weight);
  BnBackwardArgs backward;
  backward.dy = in.dy.data_ptr();
  backward.y = out.y.data_ptr();
  backward.x = in.x.data_ptr();
  backward.relu = c.relu;
  backward.param_dtype = forward.param_dtype;
  backward.weight = in.weight.data_ptr();
  backward.save_mean = forward.save_mean;
  backward.save_invstd = forward.save_invstd;
  backward.dx = out.dx.data_ptr();
  backward.dresidual = c.residual ? out.dresidual.data_ptr() : nullptr;
  backward.dweight = out.dweight.data_ptr();
  backward.dbias = out.dbias.data_ptr();
  backward.workspace = forward.workspace;
  bn_kernels::backward_passes(layout, backward, emulated);
  return out;
}

// The shapes of the GPU test, smaller: one channel tile or several (4096 channels at 16 bits),
// full or idle threads (24, 160 channels), many row blocks or one (7 x 1 x 1 rows), fp32
// parameters with 16-bit activations.
std::vector<Case> cases() {
  std::vector<Case> all;
  for (c10::ScalarType dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    all.push_back({{16, 64, 8, 8}, dtype, dtype, true, true});
    all.push_back({{5, 24, 3, 7}, dtype, dtype, false, false});
    all.push_back({{4, 160, 4, 4}, dtype, dtype, true, false});
    all.push_back({{7, 128, 1, 1}, dtype, dtype, false, true});
  }
  all.push_back({{2, 4096, 3, 3}, torch::kBFloat16, torch::kBFloat16, true, true});
  all.push_back({{8, 64, 6, 6}, torch::kBFloat16, torch::kFloat, true, true});
  all.push_back({{8, 64, 6, 6}, torch::kHalf, torch::kFloat, true, false});
  return all;
}

// A GPU of 132 multiprocessors (an H100's) at a shape of few channels: 64 row blocks, whose
// partials the statistics' finishing merges.
TEST(FusedBatchNormEmulated, ManyRowBlocks) {
  torch::manual_seed(hpc_train::testing::test_seed("test_fused_batch_norm_emulated") + 2);
  for (c10::ScalarType dtype : {torch::kFloat, torch::kBFloat16}) {
    const int64_t channels = dtype == torch::kFloat ? 16 : 32;  // four 16-byte vectors
    const Case c{{64, channels, 16, 16}, dtype, dtype, true, true};
    const Inputs in(c, torch::kCPU);
    int64_t batches_tracked = 0;
    expect_matches_reference(c, in, run_emulated(c, in, 132, 1, &batches_tracked));
  }
}

// The layouts bench/bn_layout_sweep times, at their extremes (narrow channel tiles of many row
// lanes, few rows per thread, many blocks; a tile of 3 vectors leaves threads idle): whichever
// the step comes to run computes the same batch norm.
TEST(FusedBatchNormEmulated, OtherLayouts) {
  torch::manual_seed(hpc_train::testing::test_seed("test_fused_batch_norm_emulated") + 3);
  for (const BnLayoutLimits limits : {BnLayoutLimits{8, 4, 8}, BnLayoutLimits{3, 1, 2},
                                      BnLayoutLimits{32, 8, 1}}) {
    for (c10::ScalarType dtype : {torch::kFloat, torch::kBFloat16}) {
      const Case c{{16, 96, 6, 6}, dtype, dtype, true, true};
      const Inputs in(c, torch::kCPU);
      int64_t batches_tracked = 0;
      SCOPED_TRACE("tile_vectors " + std::to_string(limits.tile_vectors) + ", rows_per_thread " +
                   std::to_string(limits.rows_per_thread) + ", blocks_per_sm " +
                   std::to_string(limits.blocks_per_sm));
      expect_matches_reference(c, in, run_emulated(c, in, 8, 1, &batches_tracked, limits));
      EXPECT_EQ(batches_tracked, 1);
    }
  }
}

constexpr int64_t kSmCount = 2;

TEST(FusedBatchNormEmulated, MatchesLibTorchInFloat64) {
  torch::manual_seed(hpc_train::testing::test_seed("test_fused_batch_norm_emulated"));
  for (const Case& c : cases()) {
    const Inputs in(c, torch::kCPU);
    int64_t batches_tracked = 0;
    const Outputs fused = run_emulated(c, in, kSmCount, 1, &batches_tracked);
    expect_matches_reference(c, in, fused);
    EXPECT_EQ(batches_tracked, 1) << c.name();
  }
}

// Three forwards in a row: each advances the running statistics and the counter once, as
// LibTorch's batch norm does (momentum 0.1), and leaves the kernels' state as it found it.
TEST(FusedBatchNormEmulated, RepeatedForwardsAdvanceTheRunningStatistics) {
  torch::manual_seed(hpc_train::testing::test_seed("test_fused_batch_norm_emulated") + 1);
  const Case c{{16, 64, 8, 8}, torch::kFloat, torch::kFloat, true, true};
  const Inputs in(c, torch::kCPU);
  int64_t batches_tracked = 0;
  const Outputs fused = run_emulated(c, in, kSmCount, 3, &batches_tracked);
  EXPECT_EQ(batches_tracked, 3);
  const torch::Tensor x = in.x.to(torch::kDouble);
  const torch::Tensor mean = x.mean({0, 2, 3});
  const torch::Tensor unbiased_var = x.var({0, 2, 3}, /*unbiased=*/true);
  torch::Tensor running_mean = in.running_mean.to(torch::kDouble);
  torch::Tensor running_var = in.running_var.to(torch::kDouble);
  for (int i = 0; i < 3; ++i) {
    running_mean = 0.9 * running_mean + 0.1 * mean;
    running_var = 0.9 * running_var + 0.1 * unbiased_var;
  }
  EXPECT_TRUE(torch::allclose(fused.running_mean.to(torch::kDouble), running_mean, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(fused.running_var.to(torch::kDouble), running_var, 1e-5, 1e-6));
}

}  // namespace

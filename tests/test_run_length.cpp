// Note [Run length]'s arithmetic: micro-steps carried over epoch boundaries, the final partial
// window, the updates each epoch holds, a resumed session's plan, --max-steps.
// tests/test_run_length.sh checks a real run against it.
#include <gtest/gtest.h>

#include <vector>

#include "hpc_train/train/run_length.h"

using namespace hpc_train;

namespace {

// The session's update sizes, from window_micro_steps and ends_update alone.
std::vector<int> windows(const RunLength& run, int64_t session_micro_steps) {
  std::vector<int> sizes;
  int in_window = 0;
  for (int64_t m = 0; m < session_micro_steps; ++m) {
    ++in_window;
    if (run.ends_update(m)) {
      EXPECT_EQ(run.window_micro_steps(m), in_window) << "micro-step " << m;
      sizes.push_back(in_window);
      in_window = 0;
    }
  }
  EXPECT_EQ(in_window, 0) << "micro-steps after the last update";
  return sizes;
}

}  // namespace

TEST(RunLength, MicroStepsCarryOverEpochBoundaries) {
  // 416 samples / micro-batch 32 = 13 micro-steps an epoch, --grad-accum 2, 4 epochs: 52
  // micro-steps, 26 updates (floor(13 / 2) x 4 = 24 planned the lr schedule before).
  const RunLength run(0, 4, 13, 13, 2, 0, 0);
  EXPECT_EQ(run.last_global_step(), 26);
  EXPECT_EQ(windows(run, 52), std::vector<int>(26, 2));
  // Update 7 takes micro-steps 12 (epoch 1's last) and 13 (epoch 2's first): epoch 2's.
  EXPECT_EQ(run.updates_in_epoch(0, 0), 6);
  EXPECT_EQ(run.updates_in_epoch(1, 0), 7);
  EXPECT_EQ(run.updates_in_epoch(2, 0), 6);
  EXPECT_EQ(run.updates_in_epoch(3, 0), 7);
  for (int epoch = 0; epoch < 4; ++epoch) EXPECT_EQ(run.micro_steps_in_epoch(epoch), 13);
  // The log's "6-7 steps per epoch".
  EXPECT_EQ(run.fewest_updates_per_epoch(), 6);
  EXPECT_EQ(run.most_updates_per_epoch(), 7);
  const RunLength divides(0, 4, 12, 12, 2, 0, 0);
  EXPECT_EQ(divides.fewest_updates_per_epoch(), 6);
  EXPECT_EQ(divides.most_updates_per_epoch(), 6);
}

TEST(RunLength, TheLastUpdateTakesWhatIsLeft) {
  // 5 micro-steps, --grad-accum 4: a whole update and a final one of 1 micro-step.
  const RunLength one_epoch(0, 1, 5, 5, 4, 0, 0);
  EXPECT_EQ(one_epoch.last_global_step(), 2);
  EXPECT_EQ(windows(one_epoch, 5), (std::vector<int>{4, 1}));
  EXPECT_EQ(one_epoch.updates_in_epoch(0, 0), 2);
  // 3 epochs of 5, --grad-accum 4: 15 micro-steps, 4 updates, the last of 3 micro-steps.
  const RunLength three_epochs(0, 3, 5, 5, 4, 0, 0);
  EXPECT_EQ(three_epochs.last_global_step(), 4);
  EXPECT_EQ(windows(three_epochs, 15), (std::vector<int>{4, 4, 4, 3}));
  EXPECT_EQ(three_epochs.updates_in_epoch(0, 0), 1);  // ends at micro-step 4
  EXPECT_EQ(three_epochs.updates_in_epoch(1, 0), 1);  // 8
  EXPECT_EQ(three_epochs.updates_in_epoch(2, 0), 2);  // 12 and the last, 15
}

TEST(RunLength, WithoutAccumulationEveryMicroStepIsAnUpdate) {
  const RunLength run(0, 2, 7, 7, 1, 0, 0);
  EXPECT_EQ(run.last_global_step(), 14);
  EXPECT_EQ(windows(run, 14), std::vector<int>(14, 1));
  EXPECT_EQ(run.updates_in_epoch(1, 0), 7);
}

TEST(RunLength, AResumedSessionContinuesThePlan) {
  // The run of MicroStepsCarryOverEpochBoundaries, resumed from its checkpoint after update 9:
  // 18 micro-steps done, 5 of them in epoch 2 (0-based 1), 8 left there.
  const RunLength resumed(1, 4, 8, 13, 2, 9, 0);
  EXPECT_EQ(resumed.last_global_step(), 26);
  EXPECT_EQ(windows(resumed, 8 + 26), std::vector<int>(17, 2));
  // Epoch 2 holds updates 7-13: 3 before the checkpoint (7, 8, 9), 4 after.
  EXPECT_EQ(resumed.updates_done_in_epoch(1, 5), 3);
  EXPECT_EQ(resumed.updates_in_epoch(1, 5), 7);
  EXPECT_EQ(resumed.updates_done_in_epoch(2, 5), 0);
  EXPECT_EQ(resumed.updates_in_epoch(2, 5), 6);
  EXPECT_EQ(resumed.micro_steps_in_epoch(1), 8);
  EXPECT_EQ(resumed.micro_steps_in_epoch(2), 13);
}

TEST(RunLength, MaxStepsCutsThePlan) {
  EXPECT_EQ(RunLength(0, 4, 13, 13, 2, 0, 10).last_global_step(), 10);
  EXPECT_EQ(RunLength(0, 4, 13, 13, 2, 0, 100).last_global_step(), 26);
  // Resumed at or past --max-steps: nothing left to plan.
  EXPECT_EQ(RunLength(1, 4, 8, 13, 2, 12, 10).last_global_step(), 12);
}

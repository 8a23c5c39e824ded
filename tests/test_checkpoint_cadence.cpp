// CheckpointCadence (Note [Checkpoint clock]): which rule makes a checkpoint due after a step,
// the reason it names, and the clock that starts again at every checkpoint written.
// tests/test_checkpoint_minutes.sh runs the rules in a real run on 3 ranks.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "hpc_train/train/checkpoint_cadence.h"

using namespace hpc_train;

namespace {

// 0.3 s: long enough that the checks right after a (re)start see it not yet elapsed on a
// loaded machine, short enough to sleep past.
constexpr double kShortMinutes = 0.005;
constexpr auto kPastShortMinutes = std::chrono::milliseconds(400);

}  // namespace

TEST(CheckpointCadence, OffWritesNothing) {
  const CheckpointCadence cadence(0, 0.0);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_FALSE(cadence.minutes_elapsed());
  for (int64_t step = 1; step <= 100; ++step) EXPECT_EQ(cadence.due(step, false), nullptr);
}

TEST(CheckpointCadence, StepsRuleNamesItsInterval) {
  const CheckpointCadence cadence(50, 0.0);
  EXPECT_EQ(cadence.due(49, false), nullptr);
  ASSERT_NE(cadence.due(50, false), nullptr);
  EXPECT_STREQ(cadence.due(50, false), "every 50 steps");
  EXPECT_STREQ(cadence.due(100, false), "every 50 steps");
  EXPECT_EQ(cadence.due(101, false), nullptr);
}

TEST(CheckpointCadence, MinutesRuleFollowsRankZerosAnswer) {
  const CheckpointCadence cadence(0, 30.0);
  // Due at any step once rank 0's clock says so, whatever this rank's clock says.
  EXPECT_FALSE(cadence.minutes_elapsed());
  EXPECT_STREQ(cadence.due(7, true), "every 30 min");
  EXPECT_EQ(cadence.due(7, false), nullptr);
  // Both due: one checkpoint, named by the step rule.
  const CheckpointCadence both(7, 0.5);
  EXPECT_STREQ(both.due(7, true), "every 7 steps");
  EXPECT_STREQ(both.due(8, true), "every 0.5 min");
}

TEST(CheckpointCadence, ClockStartsAgainAtEveryCheckpoint) {
  CheckpointCadence cadence(0, kShortMinutes);
  EXPECT_FALSE(cadence.minutes_elapsed());
  std::this_thread::sleep_for(kPastShortMinutes);
  EXPECT_TRUE(cadence.minutes_elapsed());
  cadence.checkpoint_written();
  EXPECT_FALSE(cadence.minutes_elapsed());
  std::this_thread::sleep_for(kPastShortMinutes);
  EXPECT_TRUE(cadence.minutes_elapsed());
}

TEST(CheckpointCadence, AClockThatAskedStartsAgain) {
  // Asked after every step, a clock that ran out asks once: its checkpoint comes a step later
  // (Note [Stop agreement]), and the step between must not ask for a second one.
  CheckpointCadence cadence(0, kShortMinutes);
  EXPECT_FALSE(cadence.take_minutes_elapsed());
  std::this_thread::sleep_for(kPastShortMinutes);
  EXPECT_TRUE(cadence.take_minutes_elapsed());
  EXPECT_FALSE(cadence.take_minutes_elapsed());
  std::this_thread::sleep_for(kPastShortMinutes);
  EXPECT_TRUE(cadence.take_minutes_elapsed());
}

// The fp16 loss scaler against closed-form sequences with injected overflows: DeepSpeed's
// DynamicLossScaler (hysteresis, window counted from the last overflow, floor, error at the floor)
// and the fixed scale.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "hpc_train/error.h"
#include "hpc_train/optim/loss_scaler.h"

namespace hpc_train {
namespace {

LossScalerOptions dynamic(int initial_scale_power, int window, int hysteresis, double min_scale) {
  LossScalerOptions options;
  options.initial_scale_power = initial_scale_power;
  options.scale_window = window;
  options.hysteresis = hysteresis;
  options.min_scale = min_scale;
  return options;
}

TEST(LossScaler, DefaultsAreDeepSpeeds) {
  const LossScalerOptions options;
  EXPECT_EQ(options.fixed_scale, 0.0);  // dynamic
  EXPECT_EQ(options.initial_scale_power, 16);
  EXPECT_EQ(options.scale_window, 1000);
  EXPECT_EQ(options.hysteresis, 2);
  EXPECT_EQ(options.min_scale, 1.0);
  const LossScaler scaler(options);
  EXPECT_EQ(scaler.scale(), 65536.0);
  EXPECT_EQ(scaler.hysteresis_left(), 2);
  EXPECT_EQ(scaler.steps(), 0);
  EXPECT_EQ(scaler.skipped_steps(), 0);
}

TEST(LossScaler, HysteresisAbsorbsTheFirstOverflowThenHalves) {
  LossScaler scaler{LossScalerOptions{}};
  EXPECT_TRUE(scaler.update(true));  // skipped, scale kept
  EXPECT_EQ(scaler.scale(), 65536.0);
  EXPECT_EQ(scaler.hysteresis_left(), 1);
  EXPECT_TRUE(scaler.update(true));  // halved
  EXPECT_EQ(scaler.scale(), 32768.0);
  EXPECT_EQ(scaler.hysteresis_left(), 1);
  EXPECT_TRUE(scaler.update(true));  // halves again: hysteresis refills only on growth
  EXPECT_EQ(scaler.scale(), 16384.0);
  EXPECT_FALSE(scaler.update(false));
  EXPECT_EQ(scaler.scale(), 16384.0);
  EXPECT_EQ(scaler.steps(), 4);
  EXPECT_EQ(scaler.skipped_steps(), 3);
}

TEST(LossScaler, HysteresisOneHalvesAtEveryOverflow) {
  LossScaler scaler(dynamic(10, 1000, 1, 1.0));
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 512.0);
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 256.0);
}

// Window 3, hysteresis 2, start 2^4: the scale doubles on a clean step k with
// (k - last overflow) % 3 == 0, where "last overflow" is -1 before the first one.
TEST(LossScaler, SequenceWithInjectedOverflows) {
  LossScaler scaler(dynamic(4, 3, 2, 1.0));
  struct Step {
    char outcome;  // '.' clean, 'x' overflow
    double scale_after;
    int hysteresis_after;
  };
  const Step steps[] = {
      {'.', 16, 2},  // step 0: (0+1) % 3 != 0
      {'.', 16, 2},  // step 1
      {'.', 32, 2},  // step 2: 3 clean steps from the start -> doubled
      {'x', 32, 1},  // step 3: absorbed by the hysteresis
      {'.', 32, 1},  // step 4
      {'x', 16, 1},  // step 5: halved
      {'.', 16, 1},  // step 6
      {'.', 16, 1},  // step 7
      {'.', 32, 2},  // step 8: 3 clean steps after the overflow of step 5 -> doubled, refilled
      {'x', 32, 1},  // step 9: absorbed
      {'x', 16, 1},  // step 10: halved
      {'x', 8, 1},   // step 11: halved again
      {'.', 8, 1},   // step 12
      {'.', 8, 1},   // step 13
      {'.', 16, 2},  // step 14: (14 - 11) % 3 == 0
      {'.', 16, 2},  // step 15
      {'.', 16, 2},  // step 16
      {'.', 32, 2},  // step 17: counted from the last overflow, not from the last doubling
  };
  int64_t skipped = 0;
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; ++i) {
    const bool overflow = steps[i].outcome == 'x';
    skipped += overflow ? 1 : 0;
    EXPECT_EQ(scaler.update(overflow), overflow) << "step " << i;
    EXPECT_EQ(scaler.scale(), steps[i].scale_after) << "step " << i;
    EXPECT_EQ(scaler.hysteresis_left(), steps[i].hysteresis_after) << "step " << i;
    EXPECT_EQ(scaler.steps(), static_cast<int64_t>(i) + 1);
    EXPECT_EQ(scaler.skipped_steps(), skipped);
  }
}

TEST(LossScaler, CleanRunDoublesEveryWindow) {
  LossScaler scaler(dynamic(16, 1000, 2, 1.0));
  for (int step = 1; step <= 5000; ++step) {
    scaler.update(false);
    // After n clean steps from the start: 2^16 * 2^floor(n / window).
    ASSERT_EQ(scaler.scale(), std::ldexp(1.0, 16 + step / 1000)) << "after " << step << " steps";
  }
}

TEST(LossScaler, HalvingStopsAtTheMinimumThenOverflowThere) {
  LossScaler scaler(dynamic(3, 1000, 1, 5.0));  // 8 -> max(4, 5) = 5
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 5.0);
  try {
    scaler.update(true);
    FAIL() << "no Error at the minimum scale";
  } catch (const ConfigError&) {
    FAIL() << "a ConfigError; an overflow at the minimum is a runtime Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.exit_code(), kExitRuntimeError);
    EXPECT_NE(message.find("fp16 loss scale is already at its minimum (5) and the gradients "
                           "still overflow:"),
              std::string::npos)
        << message;
    for (const char* hint : {"bf16", "--lr", "--clip-grad"}) {
      EXPECT_NE(message.find(hint), std::string::npos) << hint << " in " << message;
    }
  }
}

TEST(LossScaler, MinimumReachedThroughTheHysteresis) {
  LossScaler scaler(dynamic(1, 1000, 2, 1.0));  // 2
  EXPECT_TRUE(scaler.update(true));  // absorbed
  EXPECT_TRUE(scaler.update(true));  // 1
  EXPECT_EQ(scaler.scale(), 1.0);
  EXPECT_THROW(scaler.update(true), Error);
}

TEST(LossScaler, FixedScaleNeverChangesAndNeverGivesUp) {
  LossScalerOptions options;
  options.fixed_scale = 128;
  options.scale_window = 2;
  LossScaler scaler(options);
  EXPECT_EQ(scaler.scale(), 128.0);
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(scaler.update(true));
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(scaler.update(false));
  EXPECT_EQ(scaler.scale(), 128.0);
  EXPECT_EQ(scaler.steps(), 20);
  EXPECT_EQ(scaler.skipped_steps(), 10);

  options.fixed_scale = 1;  // at what would be the dynamic minimum: still no error
  LossScaler at_one(options);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(at_one.update(true));
  EXPECT_EQ(at_one.scale(), 1.0);
}

TEST(LossScaler, RejectsOptionsThatCannotWork) {
  EXPECT_THROW(LossScaler(dynamic(16, 0, 2, 1.0)), ConfigError);
  EXPECT_THROW(LossScaler(dynamic(16, 1000, 0, 1.0)), ConfigError);
  EXPECT_THROW(LossScaler(dynamic(16, 1000, 2, 0.0)), ConfigError);
  EXPECT_THROW(LossScaler(dynamic(-1, 1000, 2, 1.0)), ConfigError);
  LossScalerOptions negative;
  negative.fixed_scale = -1;
  EXPECT_THROW(LossScaler{negative}, ConfigError);
}

}  // namespace
}  // namespace hpc_train

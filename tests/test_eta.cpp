// Note [ETA]'s arithmetic: the steps left in an epoch and in the run (--epochs, --max-steps,
// an epoch a step longer than planned), the evaluations still to come, the seconds from the
// recent step time, and how a duration is written; and ThroughputClock, the steady state the
// step time is measured over and the warm-up before it. tests/test_end_to_end.sh checks that a
// real run's log lines carry them.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "hpc_train/monitor/run_report.h"

using namespace hpc_train;

TEST(StepsLeft, CountsTheEpochAndTheEpochsAfterIt) {
  // Step 10 (1-based) of 42 in epoch 1 of 3: 32 left in it, then 2 x 42.
  const StepsLeft left =
      steps_left({/*epoch=*/0, /*epochs=*/3, /*step_in_epoch=*/9, /*steps_per_epoch=*/42,
                  /*global_step=*/10, /*last_global_step=*/126});
  EXPECT_EQ(left.epoch, 32);
  EXPECT_EQ(left.run, 32 + 2 * 42);
  EXPECT_EQ(left.evaluations, 3);
}

TEST(StepsLeft, TheLastStepLeavesOnlyTheLastEvaluation) {
  const StepsLeft left = steps_left({2, 3, 41, 42, 126, 126});
  EXPECT_EQ(left.epoch, 0);
  EXPECT_EQ(left.run, 0);
  EXPECT_EQ(left.evaluations, 1);
}

TEST(StepsLeft, MaxStepsCutsTheRunAndTheEpoch) {
  // --max-steps 50 (the run's last global step) at global step 10: 40 left, 32 of them in this
  // epoch, 8 in the next.
  StepsLeft left = steps_left({0, 3, 9, 42, 10, 50});
  EXPECT_EQ(left.epoch, 32);
  EXPECT_EQ(left.run, 40);
  EXPECT_EQ(left.evaluations, 2);
  // --max-steps 20: the run ends inside this epoch.
  left = steps_left({0, 3, 9, 42, 10, 20});
  EXPECT_EQ(left.epoch, 10);
  EXPECT_EQ(left.run, 10);
  EXPECT_EQ(left.evaluations, 1);
  // Reached: nothing left but the stopped epoch's evaluation.
  left = steps_left({0, 3, 19, 42, 20, 20});
  EXPECT_EQ(left.epoch, 0);
  EXPECT_EQ(left.run, 0);
  EXPECT_EQ(left.evaluations, 1);
}

TEST(StepsLeft, AResumedRunCountsFromItsGlobalStep) {
  // Resumed in epoch 2 of 2 at its step 5 (global step 47), --max-steps 60.
  const StepsLeft left = steps_left({1, 2, 4, 42, 47, 60});
  EXPECT_EQ(left.epoch, 13);
  EXPECT_EQ(left.run, 13);
}

TEST(StepsLeft, AnEpochLongerThanPlannedNeverGoesNegative) {
  // An epoch has steps_per_epoch steps, give or take one.
  const StepsLeft left = steps_left({0, 2, 42, 42, 43, 85});
  EXPECT_EQ(left.epoch, 0);
  EXPECT_EQ(left.run, 42);
  EXPECT_EQ(left.evaluations, 2);
}

TEST(StepPosition, SamplesSeenAreTheStepsTimesTheGlobalBatch) {
  // The monitors' x axis (Note [Monitor tags]): 10 steps of 16 x 2 micro-steps x 3 ranks.
  const StepPosition at{0, 3, 9, 42, /*global_step=*/10, 0, /*global_batch=*/16 * 2 * 3};
  EXPECT_EQ(at.samples_seen(), 960);
}

TEST(EstimateEta, StepsTimesTheStepTimePlusEvaluations) {
  const StepsLeft left{32, 116, 3};
  Eta eta = estimate_eta(left, /*ms_per_step=*/250.0, /*evaluation_s=*/0.0);
  EXPECT_DOUBLE_EQ(eta.epoch_s, 8.0);
  EXPECT_DOUBLE_EQ(eta.run_s, 29.0);
  eta = estimate_eta(left, 250.0, /*evaluation_s=*/4.0);
  EXPECT_DOUBLE_EQ(eta.epoch_s, 8.0);  // the epoch's training loop only
  EXPECT_DOUBLE_EQ(eta.run_s, 29.0 + 3 * 4.0);
}

TEST(FormatDuration, MinutesAndSecondsThenHours) {
  EXPECT_EQ(format_duration(0.0), "0:00");
  EXPECT_EQ(format_duration(7.4), "0:07");
  EXPECT_EQ(format_duration(59.6), "1:00");
  EXPECT_EQ(format_duration(221.0), "3:41");
  EXPECT_EQ(format_duration(3599.0), "59:59");
  EXPECT_EQ(format_duration(3723.0), "1:02:03");
  EXPECT_EQ(format_duration(50 * 3600.0 + 61), "50:01:01");
  EXPECT_EQ(format_duration(-1.0), "?");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::infinity()), "?");
  EXPECT_EQ(format_duration(std::nan("")), "?");
}

TEST(DescribeEta, NamesTheEpochAndTheRun) {
  EXPECT_EQ(describe_eta({12.0, 221.0}), "ETA epoch 0:12, run 3:41");
}

// The monitors' scalars of a log interval carry the GPU figures under their metrics.jsonl names
// (every GPU run's second interval once crashed here, iterating a destroyed temporary).
TEST(IntervalEvents, CarryTheGpuSpread) {
  IntervalReport report;
  report.loss = 0.5;
  GpuSpread spread;
  spread.utilization_pct = {41.0, 97.0};
  spread.power_w = {250.0, 310.0};
  spread.measured = true;
  spread.utilization_measured = true;
  report.gpu = spread;
  for (int interval = 0; interval < 3; ++interval) {
    const std::vector<ScalarEvent> events = interval_events(report);
    auto value_of = [&](const std::string& tag) {
      for (const ScalarEvent& event : events)
        if (event.tag == tag) return event.value;
      return std::numeric_limits<double>::quiet_NaN();
    };
    EXPECT_EQ(value_of("Train/Samples/train_loss"), 0.5);
    EXPECT_EQ(value_of("Train/Samples/gpu_util_pct_min"), 41.0);
    EXPECT_EQ(value_of("Train/Samples/gpu_util_pct_max"), 97.0);
    EXPECT_EQ(value_of("Train/Samples/gpu_power_w_max"), 310.0);
  }
}

// The steady state that ms_per_step measures, and the warm-up before it.
TEST(ThroughputClock, TimesTheStepsAfterTheWarmUp) {
  ThroughputClock clock(/*global_step=*/1);  // a fresh run: step 1 is untimed
  EXPECT_EQ(clock.warmup_ms(), 0.0);
  clock.step_ended(1, 64);
  const double first_step_ms = clock.warmup_ms();
  EXPECT_GT(first_step_ms, 0.0);
  EXPECT_EQ(clock.steps(), 0);
  clock.step_ended(2, 64);
  clock.step_ended(3, 32);
  EXPECT_EQ(clock.steps(), 2);
  EXPECT_EQ(clock.samples(), 96);
  EXPECT_EQ(clock.warmup_ms(), first_step_ms);  // timed steps do not move it
  // Step 4 captured the CUDA graph: what was timed is forgotten, the warm-up reaches it.
  clock.step_ended(4, 64);
  clock.restart_after(4);
  EXPECT_EQ(clock.steps(), 0);
  EXPECT_EQ(clock.samples(), 0);
  EXPECT_GT(clock.warmup_ms(), first_step_ms);
  clock.step_ended(5, 64);
  EXPECT_EQ(clock.steps(), 1);
  EXPECT_EQ(clock.samples(), 64);
}

// Learning-rate schedules against their closed forms: constant, warm-up (linear and DeepSpeed's
// log), warm-up + cosine, the edges (no warm-up, a one-step warm-up, after the cosine's end), and
// the options the constructor rejects; WarmupDecayLR and OneCycle against DeepSpeed's source
// written out below, and multistep against torch's MultiStepLR (Note [DeepSpeed's schedules,
// step by step] in lr_schedule.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>
#include <string>

#include "hpc_train/error.h"
#include "hpc_train/optim/lr_schedule.h"

namespace hpc_train {
namespace {

constexpr double kPi = 3.14159265358979323846;

constexpr LrScheduleKind kConstant = LrScheduleKind::kConstant;
constexpr LrScheduleKind kWarmup = LrScheduleKind::kWarmup;
constexpr LrScheduleKind kWarmupCosine = LrScheduleKind::kWarmupCosine;
constexpr WarmupType kLinear = WarmupType::kLinear;
constexpr WarmupType kLog = WarmupType::kLog;

LrScheduleParams options(LrScheduleKind kind, double lr, int64_t warmup_steps,
                          WarmupType warmup_type, double start_ratio = 0.0,
                          double final_ratio = 0.0, int64_t total_steps = 0) {
  LrScheduleParams o;
  o.kind = kind;
  o.lr = lr;
  o.warmup_steps = warmup_steps;
  o.warmup_type = warmup_type;
  o.warmup_start_ratio = start_ratio;
  o.cosine_final_ratio = final_ratio;
  o.total_steps = total_steps;
  return o;
}

// The ConfigError that LrSchedule's constructor throws for `o` (a failure where it throws none).
std::string message(const LrScheduleParams& o) {
  try {
    LrSchedule schedule(o);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError";
  return "";
}

TEST(LrSchedule, Constant) {
  const LrSchedule schedule(options(kConstant, 0.003, 100, kLog));
  for (int64_t step : {0, 1, 99, 100, 1000000}) EXPECT_EQ(schedule.lr_at(step), 0.003);
  EXPECT_EQ(LrSchedule(LrScheduleParams{}).lr_at(5), 1e-3);  // the defaults
}

TEST(LrSchedule, LinearWarmup) {
  const LrSchedule schedule(options(kWarmup, 0.1, 10, kLinear, 0.2));
  for (int64_t step = 0; step < 10; ++step) {
    EXPECT_DOUBLE_EQ(schedule.lr_at(step), 0.1 * (0.2 + 0.8 * step / 10.0)) << step;
  }
  EXPECT_DOUBLE_EQ(schedule.lr_at(0), 0.02);
  EXPECT_DOUBLE_EQ(schedule.lr_at(5), 0.06);
  EXPECT_EQ(schedule.lr_at(10), 0.1);
  EXPECT_EQ(schedule.lr_at(12345), 0.1);
}

// DeepSpeed's WarmupLR: min_lr + (max_lr - min_lr) * log(step + 1) / log(warmup_num_steps).
TEST(LrSchedule, LogWarmupIsDeepSpeeds) {
  const double min_lr = 0.001;
  const double max_lr = 0.01;
  const LrSchedule schedule(options(kWarmup, max_lr, 100, kLog, min_lr / max_lr));
  EXPECT_DOUBLE_EQ(schedule.lr_at(0), min_lr);
  EXPECT_DOUBLE_EQ(schedule.lr_at(9), min_lr + (max_lr - min_lr) * 0.5);  // log 10 / log 100
  for (int64_t step : {1, 2, 17, 50, 98}) {
    EXPECT_DOUBLE_EQ(schedule.lr_at(step),
                     min_lr + (max_lr - min_lr) * std::log(step + 1.0) / std::log(100.0))
        << step;
  }
  EXPECT_DOUBLE_EQ(schedule.lr_at(99), max_lr);  // log 100 / log 100
  EXPECT_EQ(schedule.lr_at(100), max_lr);
}

TEST(LrSchedule, NoWarmupAndOneStepWarmup) {
  EXPECT_EQ(LrSchedule(options(kWarmup, 0.5, 0, kLog)).lr_at(0), 0.5);
  EXPECT_EQ(LrSchedule(options(kWarmup, 0.5, 0, kLinear, 0.1)).lr_at(0), 0.5);
  for (WarmupType type : {kLinear, kLog}) {
    const LrSchedule one(options(kWarmup, 0.5, 1, type, 0.1));
    EXPECT_DOUBLE_EQ(one.lr_at(0), 0.05) << static_cast<int>(type);  // no 0/0 for log
    EXPECT_EQ(one.lr_at(1), 0.5) << static_cast<int>(type);
  }
  // A step before the first is the first step's lr.
  EXPECT_DOUBLE_EQ(LrSchedule(options(kWarmup, 0.5, 4, kLinear, 0.1)).lr_at(-3), 0.05);
}

TEST(LrSchedule, WarmupCosine) {
  // lr 1, 10 linear warm-up steps from 0, cosine to 0.1 at step 110.
  const LrSchedule schedule(options(kWarmupCosine, 1.0, 10, kLinear, 0.0, 0.1, 110));
  EXPECT_EQ(schedule.lr_at(0), 0.0);
  EXPECT_DOUBLE_EQ(schedule.lr_at(5), 0.5);
  EXPECT_DOUBLE_EQ(schedule.lr_at(10), 1.0);  // the cosine starts at the full lr
  EXPECT_DOUBLE_EQ(schedule.lr_at(35), 0.1 + 0.9 * 0.5 * (1 + std::cos(kPi / 4)));
  EXPECT_DOUBLE_EQ(schedule.lr_at(60), 0.55);  // half way
  EXPECT_DOUBLE_EQ(schedule.lr_at(85), 0.1 + 0.9 * 0.5 * (1 + std::cos(3 * kPi / 4)));
  EXPECT_DOUBLE_EQ(schedule.lr_at(110), 0.1);
  EXPECT_DOUBLE_EQ(schedule.lr_at(5000), 0.1);  // clamped after the end
  for (int64_t step = 11; step <= 110; ++step) {
    EXPECT_LT(schedule.lr_at(step), schedule.lr_at(step - 1)) << step;
  }
}

TEST(LrSchedule, CosineWithoutWarmupAndWithLogWarmup) {
  const LrSchedule plain(options(kWarmupCosine, 2.0, 0, kLog, 0.0, 0.0, 100));
  EXPECT_EQ(plain.lr_at(0), 2.0);
  EXPECT_DOUBLE_EQ(plain.lr_at(50), 1.0);
  EXPECT_EQ(plain.lr_at(100), 0.0);

  // DeepSpeed's WarmupCosineLR defaults: log warm-up from ratio 0, cos_min_ratio 1e-4.
  const LrSchedule ds(options(kWarmupCosine, 1e-3, 1000, kLog, 0.0, 1e-4, 10000));
  EXPECT_DOUBLE_EQ(ds.lr_at(99), 1e-3 * std::log(100.0) / std::log(1000.0));
  EXPECT_DOUBLE_EQ(ds.lr_at(1000), 1e-3);
  EXPECT_DOUBLE_EQ(ds.lr_at(10000), 1e-3 * 1e-4);
  // A cosine as long as its warm-up ends at the warm-up's end.
  const LrSchedule flat(options(kWarmupCosine, 1.0, 10, kLinear, 0.0, 0.25, 10));
  EXPECT_DOUBLE_EQ(flat.lr_at(5), 0.5);
  EXPECT_DOUBLE_EQ(flat.lr_at(10), 0.25);
}

TEST(LrSchedule, RejectsWhatCannotWork) {
  EXPECT_NE(message(options(kWarmup, 1, -1, kLog)).find("--warmup-steps -1"),
            std::string::npos);
  EXPECT_NE(message(options(kWarmup, 1, 10, kLog, 1.5)).find("--warmup-start-ratio 1.5"),
            std::string::npos);
  EXPECT_NE(message(options(kWarmupCosine, 1, 10, kLog, 0, 2, 100))
                .find("--cosine-final-ratio 2"),
            std::string::npos);
  EXPECT_NE(message(options(kWarmupCosine, 1, 100, kLog, 0, 0, 50))
                .find("--schedule-steps 50: the cosine would end before the warm-up"),
            std::string::npos);
  EXPECT_NE(message(options(kWarmupCosine, 1, 0, kLog, 0, 0, 0)).find("--schedule-steps"),
            std::string::npos);
}

// DeepSpeed's WarmupDecayLR (deepspeed/runtime/lr_schedules.py), as it computes get_lr() at
// last_batch_iteration: WarmupLR's __init__ (warmup_num_steps = max(2, ...), inverse_log_warm_up)
// and WarmupDecayLR._get_gamma.
double deepspeed_warmup_decay_lr(int64_t last_batch_iteration, double warmup_min_lr,
                                 double warmup_max_lr, int64_t warmup_num_steps_given,
                                 int64_t total_num_steps, bool log_warmup) {
  const double warmup_num_steps = std::max<int64_t>(2, warmup_num_steps_given);
  const double inverse_log_warm_up = 1.0 / std::log(warmup_num_steps);
  const double it = static_cast<double>(last_batch_iteration);
  double gamma;
  if (it < warmup_num_steps) {
    gamma = log_warmup ? inverse_log_warm_up * std::log(it + 1) : it / warmup_num_steps;
  } else {
    gamma = std::max(0.0, (total_num_steps - it) /
                              std::max(1.0, static_cast<double>(total_num_steps) - warmup_num_steps));
  }
  return warmup_min_lr + (warmup_max_lr - warmup_min_lr) * gamma;
}

TEST(LrSchedule, WarmupDecayIsDeepSpeedsStepByStep) {
  for (bool log_warmup : {false, true}) {
    const double min_lr = 1e-4, max_lr = 2e-3;
    LrScheduleParams p = options(LrScheduleKind::kWarmupDecay, max_lr, 20,
                                 log_warmup ? kLog : kLinear, min_lr / max_lr);
    p.total_steps = 150;
    const LrSchedule schedule(p);
    for (int64_t step = 0; step <= 200; ++step) {
      EXPECT_NEAR(schedule.lr_at(step),
                  deepspeed_warmup_decay_lr(step, min_lr, max_lr, 20, 150, log_warmup), 1e-15)
          << "step " << step << (log_warmup ? " log" : " linear");
    }
    EXPECT_DOUBLE_EQ(schedule.lr_at(20), max_lr);   // the peak, at the warm-up's end
    EXPECT_DOUBLE_EQ(schedule.lr_at(150), min_lr);  // the floor from total_num_steps on
    EXPECT_DOUBLE_EQ(schedule.lr_at(1000), min_lr);
  }
}

// DeepSpeed's OneCycle (deepspeed/runtime/lr_schedules.py): _initialize_cycle, _get_scale_factor,
// _get_cycle_lr / _get_decay_lr and _get_cycle_mom / _get_decay_mom, at last_batch_iteration.
struct DeepSpeedOneCycle {
  double cycle_min_lr, cycle_max_lr, decay_lr_rate;
  double cycle_first_step_size, cycle_second_step_size, decay_step_size;
  double cycle_min_mom, cycle_max_mom, decay_mom_rate;

  double total_size() const { return cycle_first_step_size + cycle_second_step_size; }
  double scale_factor(int64_t last_batch_iteration) const {
    const double step_ratio = cycle_first_step_size / total_size();
    const double batch_iteration = last_batch_iteration + 1;
    const double cycle = std::floor(1 + batch_iteration / total_size());
    const double x = 1. + batch_iteration / total_size() - cycle;
    return x <= step_ratio ? x / step_ratio : (x - 1) / (step_ratio - 1);
  }
  bool skip_lr_decay() const { return decay_step_size == 0 || decay_lr_rate == 0; }
  bool skip_mom_decay() const { return decay_step_size == 0 || decay_mom_rate == 0; }
  double lr(int64_t last_batch_iteration) const {
    if (last_batch_iteration < total_size())
      return cycle_min_lr + (cycle_max_lr - cycle_min_lr) * scale_factor(last_batch_iteration);
    if (skip_lr_decay()) return cycle_min_lr;
    const double decay_interval = (last_batch_iteration - total_size() + 1) / decay_step_size;
    return cycle_min_lr / (1 + decay_lr_rate * decay_interval);
  }
  double momentum(int64_t last_batch_iteration) const {
    if (last_batch_iteration < total_size())
      return cycle_max_mom - (cycle_max_mom - cycle_min_mom) * scale_factor(last_batch_iteration);
    if (skip_mom_decay()) return cycle_max_mom;
    const double decay_interval = (last_batch_iteration - total_size() + 1) / decay_step_size;
    return cycle_max_mom * (1 + decay_mom_rate * decay_interval);
  }
};

TEST(LrSchedule, OneCycleIsDeepSpeedsStepByStep) {
  const DeepSpeedOneCycle cases[] = {
      {0.01, 0.1, 0.0, 40, 40, 0, 0.85, 0.95, 0.0},     // symmetric, no decay
      {0.002, 0.05, 0.5, 30, 70, 10, 0.8, 0.9, 0.1},    // asymmetric, lr and momentum decay
      {0.0, 1.0, 0.0, 1, 0, 0, 0.5, 0.9, 0.0},          // one step up, none down
  };
  for (const DeepSpeedOneCycle& ds : cases) {
    LrScheduleParams p;
    p.kind = LrScheduleKind::kOneCycle;
    p.lr = ds.cycle_max_lr;
    p.cycle_min_ratio = ds.cycle_min_lr / ds.cycle_max_lr;
    p.cycle_first_steps = static_cast<int64_t>(ds.cycle_first_step_size);
    p.cycle_second_steps = static_cast<int64_t>(ds.cycle_second_step_size);
    p.decay_lr_rate = ds.decay_lr_rate;
    p.decay_step_size = static_cast<int64_t>(ds.decay_step_size);
    p.cycle_momentum = true;
    p.cycle_min_momentum = ds.cycle_min_mom;
    p.cycle_max_momentum = ds.cycle_max_mom;
    p.decay_momentum_rate = ds.decay_mom_rate;
    const LrSchedule schedule(p);
    for (int64_t step = 0; step <= 250; ++step) {
      EXPECT_NEAR(schedule.lr_at(step), ds.lr(step), 1e-15) << "step " << step;
      EXPECT_NEAR(schedule.momentum_at(step, 0.123), ds.momentum(step), 1e-15) << "step " << step;
    }
    p.cycle_momentum = false;  // the optimizer's own momentum throughout
    EXPECT_EQ(LrSchedule(p).momentum_at(5, 0.123), 0.123);
  }
  // The peak at the end of the way up, momentum at its lowest there.
  LrScheduleParams p;
  p.kind = LrScheduleKind::kOneCycle;
  p.lr = 0.4;
  p.cycle_min_ratio = 0.25;
  p.cycle_first_steps = 10;
  p.cycle_second_steps = 10;
  p.cycle_momentum = true;
  const LrSchedule schedule(p);
  EXPECT_DOUBLE_EQ(schedule.lr_at(9), 0.4);  // last_batch_iteration 9: batch_iteration 10
  EXPECT_DOUBLE_EQ(schedule.momentum_at(9, 0.0), p.cycle_min_momentum);
  EXPECT_DOUBLE_EQ(schedule.lr_at(19), 0.1);  // back at the minimum
  EXPECT_DOUBLE_EQ(schedule.lr_at(500), 0.1);
}

// torch.optim.lr_scheduler.MultiStepLR stepped once per optimizer step: the lr of step k is
// base x gamma ^ (milestones <= k), milestones counted as often as given; after a warm-up.
TEST(LrSchedule, MultiStepIsTorchsMultiStepLr) {
  LrScheduleParams p = options(LrScheduleKind::kMultiStep, 0.1, 0, kLinear);
  const std::vector<int64_t> milestones = {30, 60, 60, 90};
  p.milestone_count = static_cast<int32_t>(milestones.size());
  std::copy(milestones.begin(), milestones.end(), p.milestones);
  p.milestone_gamma = 0.2;
  const LrSchedule schedule(p);
  for (int64_t step = 0; step < 120; ++step) {
    const auto passed = std::count_if(milestones.begin(), milestones.end(),
                                      [&](int64_t m) { return m <= step; });
    EXPECT_NEAR(schedule.lr_at(step), 0.1 * std::pow(0.2, static_cast<double>(passed)), 1e-17)
        << step;
  }
  EXPECT_DOUBLE_EQ(schedule.lr_at(29), 0.1);
  EXPECT_DOUBLE_EQ(schedule.lr_at(30), 0.02);
  EXPECT_DOUBLE_EQ(schedule.lr_at(60), 0.1 * 0.2 * 0.2 * 0.2);
  p.warmup_steps = 10;  // warmed up first, then the milestones
  const LrSchedule warmed(p);
  EXPECT_DOUBLE_EQ(warmed.lr_at(5), 0.05);
  EXPECT_DOUBLE_EQ(warmed.lr_at(10), 0.1);
  EXPECT_DOUBLE_EQ(warmed.lr_at(30), 0.02);
}

TEST(LrSchedule, RejectsBadOneCycleDecayAndMilestones) {
  LrScheduleParams cycle;
  cycle.kind = LrScheduleKind::kOneCycle;
  EXPECT_NE(message(cycle).find("--cycle-first-steps"), std::string::npos);
  LrScheduleParams decay = options(LrScheduleKind::kWarmupDecay, 1, 100, kLog, 0, 0, 50);
  EXPECT_NE(message(decay).find("--schedule-steps 50: the decay would end before the warm-up"),
            std::string::npos);
  LrScheduleParams steps = options(LrScheduleKind::kMultiStep, 1, 0, kLog);
  steps.milestone_count = 2;
  steps.milestones[0] = 50;
  steps.milestones[1] = 40;
  EXPECT_NE(message(steps).find("--lr-milestones"), std::string::npos);
}

}  // namespace
}  // namespace hpc_train

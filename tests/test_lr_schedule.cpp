// Learning-rate schedules against their closed forms: constant, warm-up (linear and DeepSpeed's
// log), warm-up + cosine, the edges (no warm-up, a one-step warm-up, after the cosine's end), and
// the options the constructor rejects.
#include <gtest/gtest.h>

#include <cmath>
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
  const auto message = [](const LrScheduleParams& o) -> std::string {
    try {
      LrSchedule schedule(o);
    } catch (const ConfigError& e) {
      return e.what();
    }
    ADD_FAILURE() << "no ConfigError";
    return "";
  };
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

}  // namespace
}  // namespace hpc_train

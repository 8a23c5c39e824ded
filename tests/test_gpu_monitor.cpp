// GPU monitoring, MFU arithmetic and FLOP counts, with closed-form answers, at 1 and 3 ranks.
// On a machine without NVML or a GPU the monitor must say why and never fail.
//
// Built a second time with HPC_TRAIN_TEST_ON_GPU (GPU build, label gpu, 1 rank): the monitor
// and the allocator's peak on a real GPU instead.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "hpc_train/comm/comm.h"
#include "hpc_train/error.h"
#include "hpc_train/monitor/gpu_monitor.h"
#include "hpc_train/model/models.h"
#include "mpi_world.h"

using namespace hpc_train;

namespace {

using test_support::world_rank;
using test_support::world_size;

}  // namespace

#ifndef HPC_TRAIN_TEST_ON_GPU

TEST(GpuMonitor, ACpuRankIsUnavailableAndSaysWhy) {
  GpuMonitor monitor(-1);
  EXPECT_FALSE(monitor.available());
  EXPECT_NE(monitor.unavailable_reason().find("CPU"), std::string::npos)
      << monitor.unavailable_reason();
  EXPECT_EQ(monitor.take_interval().samples, 0);
}

#ifndef HPC_TRAIN_WITH_CUDA
// This build cannot find a GPU in NVML (no CUDA to ask for its PCI bus id); on this machine
// there is usually no NVML either. Either way: unavailable, a reason, no crash, empty intervals.
TEST(GpuMonitor, WithoutCudaOrNvmlIsUnavailable) {
  GpuMonitor monitor(0, /*sample_interval_ms=*/10.0);
  EXPECT_FALSE(monitor.available());
  EXPECT_FALSE(monitor.unavailable_reason().empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const GpuSample first = monitor.take_interval();
  const GpuSample second = monitor.take_interval();
  EXPECT_EQ(first.samples, 0);
  EXPECT_EQ(second.samples, 0);
  EXPECT_EQ(second.memory_used_bytes, 0);
  EXPECT_EQ(allocator_peak_bytes(0), 0);
  EXPECT_EQ(cuda_device_name(0), "");
}
#endif

TEST(GpuMonitor, MovedFromIsUnavailable) {
  GpuMonitor monitor(-1);
  GpuMonitor moved(std::move(monitor));
  EXPECT_FALSE(monitor.available());  // NOLINT(bugprone-use-after-move): what is tested
  EXPECT_EQ(monitor.take_interval().samples, 0);
  EXPECT_FALSE(moved.unavailable_reason().empty());
}

// Note [Utilisation over the interval] in closed form: the driver's samples at 100, 200 and 300 us
// say 10, 20 and 60%.
TEST(UtilizationOverInterval, MeanOfTheSamplesEndingInside) {
  const std::vector<UtilizationSample> samples = {{100, 10.0}, {200, 20.0}, {300, 60.0}};
  const IntervalUtilization all = utilization_over_interval(samples, 50, 300);
  EXPECT_EQ(all.samples, 3);
  EXPECT_DOUBLE_EQ(all.utilization_pct, 30.0);
  EXPECT_EQ(all.seen_through_us, 300u);
  // (start, end]: a sample stamped at the start ended the interval before, one at the end is in.
  const IntervalUtilization bounds = utilization_over_interval(samples, 100, 300);
  EXPECT_EQ(bounds.samples, 2);
  EXPECT_DOUBLE_EQ(bounds.utilization_pct, 40.0);
  const IntervalUtilization one_us = utilization_over_interval(samples, 199, 200);
  EXPECT_EQ(one_us.samples, 1);
  EXPECT_DOUBLE_EQ(one_us.utilization_pct, 20.0);
  // The buffer's order does not matter.
  const IntervalUtilization shuffled =
      utilization_over_interval({{300, 60.0}, {100, 10.0}, {200, 20.0}}, 100, 300);
  EXPECT_EQ(shuffled.samples, 2);
  EXPECT_DOUBLE_EQ(shuffled.utilization_pct, 40.0);
  EXPECT_EQ(shuffled.seen_through_us, 300u);
}

// An interval between two sample ends (shorter than the driver's period: microseconds between
// two take_interval calls) has no utilisation of its own: NaN, not the newest sample's 60%.
// The samples before it are seen all the same, so the next reading starts after them.
TEST(UtilizationOverInterval, AnIntervalWithoutSamplesIsUnknown) {
  const std::vector<UtilizationSample> samples = {{100, 10.0}, {200, 20.0}, {300, 60.0}};
  for (const auto& [start_us, end_us] :
       std::vector<std::pair<uint64_t, uint64_t>>{{300, 301}, {300, 300}, {250, 299}, {0, 99}}) {
    const IntervalUtilization interval = utilization_over_interval(samples, start_us, end_us);
    EXPECT_TRUE(std::isnan(interval.utilization_pct)) << "(" << start_us << ", " << end_us << "]";
    EXPECT_EQ(interval.samples, 0) << "(" << start_us << ", " << end_us << "]";
  }
  EXPECT_EQ(utilization_over_interval(samples, 300, 301).seen_through_us, 300u);
  EXPECT_EQ(utilization_over_interval(samples, 250, 299).seen_through_us, 200u);
  EXPECT_EQ(utilization_over_interval(samples, 0, 99, 42).seen_through_us, 42u);  // none seen
  // An empty reading (NVML_ERROR_NOT_FOUND: nothing after the last seen) is the same answer.
  const IntervalUtilization empty = utilization_over_interval({}, 300, 301, 300);
  EXPECT_TRUE(std::isnan(empty.utilization_pct));
  EXPECT_EQ(empty.samples, 0);
  EXPECT_EQ(empty.seen_through_us, 300u);
}

// A sample stamped after the interval's end (written between the host's clock reading and the
// buffer's) belongs to the next interval: not counted now, not marked seen, counted next time.
TEST(UtilizationOverInterval, ASampleAfterTheEndIsLeftForTheNextInterval) {
  const std::vector<UtilizationSample> samples = {{100, 10.0}, {200, 20.0}, {300, 60.0}};
  const IntervalUtilization first = utilization_over_interval(samples, 0, 250);
  EXPECT_EQ(first.samples, 2);
  EXPECT_DOUBLE_EQ(first.utilization_pct, 15.0);
  EXPECT_EQ(first.seen_through_us, 200u);
  // The driver, asked for what follows 200, returns the sample at 300 again.
  const IntervalUtilization next =
      utilization_over_interval({{300, 60.0}}, 250, 400, first.seen_through_us);
  EXPECT_EQ(next.samples, 1);
  EXPECT_DOUBLE_EQ(next.utilization_pct, 60.0);
  EXPECT_EQ(next.seen_through_us, 300u);
}

// A value NVML gave in a type the monitor does not read (NaN) is seen but not averaged; the
// seen timestamp never goes back.
TEST(UtilizationOverInterval, UnreadableValuesAndAnEarlierBuffer) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const IntervalUtilization interval =
      utilization_over_interval({{100, nan}, {200, 20.0}, {300, nan}}, 0, 400);
  EXPECT_EQ(interval.samples, 1);
  EXPECT_DOUBLE_EQ(interval.utilization_pct, 20.0);
  EXPECT_EQ(interval.seen_through_us, 300u);
  const IntervalUtilization only_nan = utilization_over_interval({{100, nan}}, 0, 400);
  EXPECT_TRUE(std::isnan(only_nan.utilization_pct));
  EXPECT_EQ(only_nan.samples, 0);
  EXPECT_EQ(utilization_over_interval({{100, 10.0}}, 0, 400, 500).seen_through_us, 500u);
}

TEST(MinMaxOverRanks, ElementWise) {
  const int r = world_rank(), n = world_size();
  Communicator comm(MPI_COMM_WORLD);
  const std::vector<MinMax> spread =
      min_max_over_ranks({static_cast<double>(r), -2.0 * r, 5.0}, comm);
  ASSERT_EQ(spread.size(), 3u);
  EXPECT_EQ(spread[0].min, 0.0);
  EXPECT_EQ(spread[0].max, n - 1.0);
  EXPECT_EQ(spread[1].min, -2.0 * (n - 1));
  EXPECT_EQ(spread[1].max, 0.0);
  EXPECT_EQ(spread[2].min, 5.0);
  EXPECT_EQ(spread[2].max, 5.0);
}

TEST(MinMaxOverRanks, LeavesOutNaN) {
  const int r = world_rank(), n = world_size();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Rank 0 measured nothing: ranks 1..n-1 give 10 + r.
  Communicator comm(MPI_COMM_WORLD);
  const std::vector<MinMax> spread = min_max_over_ranks({r == 0 ? nan : 10.0 + r, nan}, comm);
  if (n > 1) {
    EXPECT_EQ(spread[0].min, 11.0);
    EXPECT_EQ(spread[0].max, 10.0 + (n - 1));
  } else {
    EXPECT_EQ(spread[0].min, 0.0);  // nobody measured: 0, 0
    EXPECT_EQ(spread[0].max, 0.0);
  }
  EXPECT_EQ(spread[1].min, 0.0);
  EXPECT_EQ(spread[1].max, 0.0);
}

TEST(GpuSpread, OverRanksForTheLogLine) {
  const int r = world_rank(), n = world_size();
  GpuSample sample;
  sample.utilization_pct = 90.0 + r;
  sample.memory_used_bytes = static_cast<int64_t>(3.1e9 + 0.05e9 * r);
  sample.power_w = 310.0 + 10.0 * r;
  sample.samples = 5;
  Communicator comm(MPI_COMM_WORLD);
  const GpuSpread spread = gpu_spread_over_ranks(sample, static_cast<int64_t>(1.2e9), comm);
  EXPECT_TRUE(spread.measured);
  EXPECT_EQ(spread.utilization_pct.min, 90.0);
  EXPECT_EQ(spread.utilization_pct.max, 90.0 + (n - 1));
  EXPECT_EQ(spread.power_w.max, 310.0 + 10.0 * (n - 1));
  if (n == 3) {
    EXPECT_EQ(spread.describe(),
              "GPU util 90-92%, mem 3.1-3.2 GB, power 310-330 W, peak alloc 1.2-1.2 GB");
  }
  const nlohmann::json record = spread.to_json();
  EXPECT_EQ(record.at("gpu_util_pct_min").get<double>(), 90.0);
  EXPECT_EQ(record.at("gpu_alloc_peak_bytes_max").get<double>(), 1.2e9);
}

// A rank whose interval holds no driver utilisation sample (shorter than the driver's period)
// leaves utilisation out; where no rank has one, it reads n/a, not 0% (Note [Utilisation over
// the interval]). Memory and power stay.
TEST(GpuSpread, UtilisationUnknownForAnIntervalWithoutSamples) {
  const int r = world_rank(), n = world_size();
  GpuSample sample;
  sample.utilization_pct = r == n - 1 ? 55.0 : std::numeric_limits<double>::quiet_NaN();
  sample.memory_used_bytes = static_cast<int64_t>(2.2e9);
  sample.power_w = 120.0;
  sample.samples = 1;
  Communicator comm(MPI_COMM_WORLD);
  const GpuSpread one_rank_knows = gpu_spread_over_ranks(sample, 0, comm);
  EXPECT_TRUE(one_rank_knows.utilization_measured);
  EXPECT_EQ(one_rank_knows.utilization_pct.min, 55.0);
  EXPECT_EQ(one_rank_knows.utilization_pct.max, 55.0);

  sample.utilization_pct = std::numeric_limits<double>::quiet_NaN();
  const GpuSpread nobody_knows = gpu_spread_over_ranks(sample, 0, comm);
  EXPECT_TRUE(nobody_knows.measured);
  EXPECT_FALSE(nobody_knows.utilization_measured);
  EXPECT_EQ(nobody_knows.describe(),
            "GPU util n/a, mem 2.2-2.2 GB, power 120-120 W, peak alloc 0.0-0.0 GB");
  EXPECT_TRUE(nobody_knows.to_json().at("gpu_util_pct_min").is_null());
  EXPECT_EQ(nobody_knows.to_json().at("gpu_power_w_max").get<double>(), 120.0);
}

TEST(GpuSpread, UnmeasuredRanksShowOnlyTheAllocator) {
  const int r = world_rank(), n = world_size();
  Communicator comm(MPI_COMM_WORLD);
  const GpuSpread spread = gpu_spread_over_ranks(GpuSample{}, static_cast<int64_t>(1e9) * r, comm);
  EXPECT_FALSE(spread.measured);
  char expected[64];
  std::snprintf(expected, sizeof(expected), "peak alloc 0.0-%.1f GB", n - 1.0);
  EXPECT_EQ(spread.describe(), expected);
  EXPECT_TRUE(spread.to_json().at("gpu_util_pct_max").is_null());
}

// The dense peaks of NVIDIA's H100 SXM5 / H200 SXM figures (gpu_monitor.cpp cites them).
TEST(PeakFlops, KnownHopperBoardsOnly) {
  EXPECT_EQ(peak_flops_per_s("NVIDIA H200", Precision::kBf16, false), 989.4e12);
  EXPECT_EQ(peak_flops_per_s("NVIDIA H200", Precision::kFp16, false), 989.4e12);
  EXPECT_EQ(peak_flops_per_s("NVIDIA H200", Precision::kBf16, true), 989.4e12);  // no fp32 here
  EXPECT_EQ(peak_flops_per_s("NVIDIA H100 80GB HBM3", Precision::kFp32, true), 494.7e12);
  EXPECT_EQ(peak_flops_per_s("NVIDIA H100 80GB HBM3", Precision::kFp32, false), 66.9e12);
  EXPECT_EQ(peak_flops_per_s("NVIDIA H100 PCIe", Precision::kBf16, false), 0.0);
  EXPECT_EQ(peak_flops_per_s("NVIDIA H200 NVL", Precision::kBf16, false), 0.0);
  EXPECT_EQ(peak_flops_per_s("NVIDIA GeForce RTX 4090", Precision::kBf16, false), 0.0);
  EXPECT_EQ(peak_flops_per_s("NVIDIA GH200 480GB", Precision::kFp32, true), 0.0);
  EXPECT_EQ(peak_flops_per_s("", Precision::kBf16, false), 0.0);
}

TEST(Mfu, FractionOfThePeak) {
  // 3 GFLOP per sample at 1000 samples/s on 2 GPUs of 3 TFLOP/s: 3e12 / 6e12.
  EXPECT_DOUBLE_EQ(model_flops_utilization(3e9, 1000.0, 2, 3e12), 0.5);
  EXPECT_EQ(model_flops_utilization(3e9, 1000.0, 2, 0.0), 0.0);  // unknown peak
}

// simple_cnn on 1x28x28, 10 classes, by hand (multiply-accumulates = outputs x inputs per output):
//   conv1 1->32, 3x3, padded: 28*28*32 = 25,088 outputs x 1*9   =   225,792
//   (max-pool to 14x14)  conv2 32->64: 14*14*64 = 12,544 x 32*9 = 3,612,672
//   (max-pool to 7x7)    fc1 64*7*7 = 3,136 -> 512               = 1,605,632
//   fc2 512 -> 10                                                =     5,120
//   5,449,216 multiply-accumulates = 10,898,432 FLOPs
TEST(ModelFlops, SimpleCnnOnFashionMnistByHand) {
  const ModelShape shape{1, 28, 28, 10};
  EXPECT_EQ(forward_flops_per_sample("simple_cnn", shape), 10898432.0);
  EXPECT_EQ(training_flops_per_sample("simple_cnn", shape), 3 * 10898432.0);
}

// resnet18 (CIFAR variant) on 3x32x32, 10 classes, by hand:
//   stem 3->64 at 32x32: 65,536 outputs x 27                                 =   1,769,472
//   layer1, 4 convs 64->64 at 32x32: 4 x 65,536 x 576                        = 150,994,944
//   layer2 at 16x16 (32,768 outputs): 64->128 stride 2: x 576 = 18,874,368;
//     three 128->128: 3 x 32,768 x 1,152 = 113,246,208; 1x1 shortcut x 64 = 2,097,152
//                                                                            = 134,217,728
//   layer3 (8x8 x 256) and layer4 (4x4 x 512): channels double as the area quarters, so
//     the same as layer2 each                                                 = 268,435,456
//   fc 512 -> 10                                                              =       5,120
//   555,422,720 multiply-accumulates = 1,110,845,440 FLOPs (the usual 0.56 GMAC)
TEST(ModelFlops, ResNet18OnCifarByHand) {
  EXPECT_EQ(forward_flops_per_sample("resnet18", ModelShape{3, 32, 32, 10}), 1110845440.0);
}

TEST(ModelFlops, UnknownModel) {
  EXPECT_THROW(forward_flops_per_sample("vgg99", ModelShape{3, 32, 32, 10}), ConfigError);
}

#else  // HPC_TRAIN_TEST_ON_GPU: GPU 0 of this process

namespace {

// Matrix products on GPU 0 for `duration`.
void keep_gpu_busy(std::chrono::milliseconds duration) {
  const at::TensorOptions on_gpu = at::TensorOptions().device(at::kCUDA, 0);
  const at::Tensor a = at::randn({4096, 4096}, on_gpu);
  at::Tensor c = at::empty({4096, 4096}, on_gpu);
  const auto until = std::chrono::steady_clock::now() + duration;
  while (std::chrono::steady_clock::now() < until) {
    at::mm_out(c, a, a);
    c.sum().item<float>();  // keeps the queue short, so the loop's time is the GPU's
  }
}

}  // namespace

TEST(GpuMonitorOnGpu, SamplesABusyGpu) {
  GpuMonitor monitor(0, /*sample_interval_ms=*/50.0);
  ASSERT_TRUE(monitor.available()) << monitor.unavailable_reason();
  monitor.take_interval();
  keep_gpu_busy(std::chrono::seconds(1));
  const GpuSample sample = monitor.take_interval();
  EXPECT_GE(sample.samples, 10);
  EXPECT_GE(sample.utilization_pct, 0.0);
  EXPECT_LE(sample.utilization_pct, 100.0);
  EXPECT_GT(sample.utilization_pct, 0.0);  // it was busy
  EXPECT_GT(sample.memory_used_bytes, 0);
  EXPECT_GT(sample.power_w, 0.0);
  std::printf("GPU 0: util %.0f%%, mem %.2f GB, power %.0f W over %lld samples\n",
              sample.utilization_pct, sample.memory_used_bytes / 1e9, sample.power_w,
              static_cast<long long>(sample.samples));
}

// Intervals microseconds long, back to back, after a busy half second. Which of them holds a
// driver sample is the driver's timing, not the test's, so the test asks what holds whatever it
// is: every interval's utilisation is NaN exactly when no driver sample was averaged (which
// samples count is utilization_over_interval's decision, tested in closed form on the CPU), the
// busy half second holds samples, and of 20 short intervals, together far shorter than the
// driver's sample period (about 1/6 s on an H200), some hold none, and read unknown. It asked
// this of one short interval, and failed on an H100: a sample fell in it, or the driver answered
// NVML_ERROR_NOT_FOUND for a buffer with nothing new (as NVML documents), which the monitor took
// for a failed read and answered with the polled value.
TEST(GpuMonitorOnGpu, UtilisationOfAnIntervalWithoutSamplesIsUnknown) {
  GpuMonitor monitor(0, /*sample_interval_ms=*/50.0);
  ASSERT_TRUE(monitor.available()) << monitor.unavailable_reason();
  keep_gpu_busy(std::chrono::milliseconds(500));  // an idle GPU's sample buffer may run dry
  const GpuSample busy = monitor.take_interval();
  EXPECT_GT(busy.utilization_samples, 0);
  EXPECT_FALSE(std::isnan(busy.utilization_pct));
  constexpr int kShortIntervals = 20;
  int unknown = 0;
  for (int i = 0; i < kShortIntervals; ++i) {
    const GpuSample sample = monitor.take_interval();
    EXPECT_EQ(std::isnan(sample.utilization_pct), sample.utilization_samples == 0)
        << "interval " << i << ": " << sample.utilization_pct << "% over "
        << sample.utilization_samples << " samples";
    if (sample.utilization_samples == 0) ++unknown;
  }
  std::printf("%d of %d back-to-back intervals held no driver sample\n", unknown, kShortIntervals);
  EXPECT_GT(unknown, 0);
}

// Note [Monitor off the step's path]: before the thread's first round the interval is read on
// the spot; later, an interval without a round of its own takes the latest round's reading.
TEST(GpuMonitorOnGpu, ShortIntervalIsSampledOnTheSpot) {
  GpuMonitor monitor(0, /*sample_interval_ms=*/10000.0);
  ASSERT_TRUE(monitor.available()) << monitor.unavailable_reason();
  EXPECT_EQ(monitor.take_interval().samples, 1);
}

TEST(GpuMonitorOnGpu, ShortIntervalAfterARoundTakesItsReading) {
  GpuMonitor monitor(0, /*sample_interval_ms=*/50.0);
  ASSERT_TRUE(monitor.available()) << monitor.unavailable_reason();
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  const GpuSample rounds = monitor.take_interval();
  EXPECT_GE(rounds.samples, 1);
  const GpuSample carried = monitor.take_interval();  // microseconds later: no round of its own
  EXPECT_EQ(carried.samples, 1);
  EXPECT_GT(carried.memory_used_bytes, 0);
}

TEST(GpuMonitorOnGpu, AllocatorPeakGrowsWithAnAllocation) {
  constexpr int64_t kBytes = int64_t{256} << 20;
  const at::TensorOptions bytes_on_gpu = at::TensorOptions().dtype(at::kByte).device(at::kCUDA, 0);
  at::Tensor warm = at::zeros({1}, bytes_on_gpu);  // the allocator exists
  reset_allocator_peak(0);
  const int64_t before = allocator_peak_bytes(0);
  {
    const at::Tensor big = at::empty({kBytes}, bytes_on_gpu);
    EXPECT_GE(allocator_peak_bytes(0), before + kBytes);
  }
  EXPECT_GE(allocator_peak_bytes(0), before + kBytes);  // a peak outlives the tensor
  reset_allocator_peak(0);
  EXPECT_LT(allocator_peak_bytes(0), before + kBytes);  // until reset
}

TEST(GpuMonitorOnGpu, DeviceNameAndPeak) {
  const std::string name = cuda_device_name(0);
  EXPECT_FALSE(name.empty());
  std::printf("GPU 0 is \"%s\": bf16 dense peak %.1f TFLOP/s (0 = unknown board)\n", name.c_str(),
              peak_flops_per_s(name, Precision::kBf16, false) / 1e12);
  if (name.find("H200") != std::string::npos && name.find("NVL") == std::string::npos) {
    EXPECT_EQ(peak_flops_per_s(name, Precision::kBf16, false), 989.4e12);
  }
}

TEST(GpuMonitorOnGpu, SpreadAtOneRank) {
  GpuMonitor monitor(0, 20.0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Communicator comm(MPI_COMM_WORLD);
  const GpuSpread spread =
      gpu_spread_over_ranks(monitor.take_interval(), allocator_peak_bytes(0), comm);
  EXPECT_TRUE(spread.measured);
  EXPECT_EQ(spread.memory_used_bytes.min, spread.memory_used_bytes.max);
  std::printf("%s\n", spread.describe().c_str());
}

#endif  // HPC_TRAIN_TEST_ON_GPU

// GPU monitoring: what each rank's GPU does while training, and how close to its peak.
//
//   GpuMonitor               utilisation, memory used and power of this rank's GPU, from NVML,
//                            sampled in a thread; averaged (or maxed) per log interval
//   allocator_peak_bytes     the caching allocator's peak of allocated bytes (LibTorch's own view)
//   gpu_spread_over_ranks    min and max of those over the ranks, for rank 0's log line (through
//                            the Communicator, so that --comm-timeout watches it)
//   peak_flops_per_s         the GPU's dense peak, for MFU (model FLOPs utilisation)
//
// NVML is loaded at run time (dlopen of libnvidia-ml.so.1, which comes with the driver), so that
// nothing links against it: the CPU build, and machines without a driver, just report that
// monitoring is unavailable and why. Only gpu_monitor.cpp knows NVML.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hpc_train/config/config_choices.h"

namespace hpc_train {

class Communicator;  // comm.h

constexpr double kDefaultGpuSampleIntervalMs = 200.0;

// What NVML saw on one GPU over an interval.
struct GpuSample {
  double utilization_pct = 0.0;   // NVML's "GPU busy" percentage over the interval; NaN when
                                  // no driver sample covers it yet (Note [Utilisation over
                                  // the interval] in gpu_monitor.cpp)
  int64_t utilization_samples = 0;  // the readings utilization_pct is the mean of (driver
                                    // samples, or polls where the driver's buffer cannot be
                                    // read); 0 exactly when it is NaN
  int64_t memory_used_bytes = 0;  // max; the whole device, every process on it
  double power_w = 0.0;           // mean board power
  int64_t samples = 0;            // 0: nothing was measured (no NVML, no GPU, a CPU rank)
};

// One of the driver's utilisation samples (nvmlDeviceGetSamples): the GPU's busy percentage
// over the driver's sample period that ends at `time_stamp_us` (the host's clock, microseconds).
// NaN for a value NVML gave in a type the monitor does not know.
struct UtilizationSample {
  uint64_t time_stamp_us = 0;
  double utilization_pct = 0.0;
};

// What the driver's samples say of the interval (start_us, end_us].
struct IntervalUtilization {
  double utilization_pct = 0.0;  // the mean of the samples that fall in it; NaN for none
  int64_t samples = 0;           // how many fall in it (those with a NaN value left out)
  // The newest timestamp at or before end_us among `samples`, or the `seen_through_us` given if
  // that is later: the next reading asks the driver for the samples after it, so that a sample
  // stamped after end_us is counted in the next interval rather than lost.
  uint64_t seen_through_us = 0;
};

// Note [Utilisation over the interval] (gpu_monitor.cpp), as a pure function: which of
// `samples` (any order) fall in (start_us, end_us], and the interval's utilisation from them.
// `seen_through_us`: what the previous reading had seen.
IntervalUtilization utilization_over_interval(const std::vector<UtilizationSample>& samples,
                                              uint64_t start_us, uint64_t end_us,
                                              uint64_t seen_through_us = 0);

// Samples one GPU every `sample_interval_ms` in a thread of its own while it lives (RAII: the
// destructor stops and joins the thread, then shuts NVML down). Movable, not copyable; a
// moved-from monitor is unavailable.
//
// Note [Monitor off the step's path]
// take_interval runs at every log line on the training thread, between two steps, where an NVML
// call keeps the next step waiting: a poll of utilisation, memory and power, or a read of the
// driver's sample buffer, each a driver round trip. So the thread makes them all, every sample
// interval, and take_interval only sums what the thread has read: the polled figures of the
// rounds that ended in the interval (for an interval shorter than the sample interval, the
// latest round's; NVML is asked on the spot only before the thread's first round), and the
// utilisation of the driver samples up to the thread's latest reading of the buffer, so at most
// one sample interval behind the log line.
class GpuMonitor {
 public:
  // `cuda_device` as CUDA numbers it in this process (CUDA_VISIBLE_DEVICES applies: the
  // monitor finds the same GPU in NVML by its PCI bus id); < 0 for a rank that computes on the
  // CPU. Never throws for a missing library or GPU: see available().
  explicit GpuMonitor(int cuda_device, double sample_interval_ms = kDefaultGpuSampleIntervalMs);
  ~GpuMonitor();
  GpuMonitor(GpuMonitor&&) noexcept;
  GpuMonitor& operator=(GpuMonitor&&) noexcept;
  GpuMonitor(const GpuMonitor&) = delete;
  GpuMonitor& operator=(const GpuMonitor&) = delete;

  bool available() const;
  // Why not, e.g. "libnvidia-ml.so.1: cannot open shared object file"; empty when available.
  const std::string& unavailable_reason() const;

  // Since the previous call (or construction), from what the thread has read (Note [Monitor
  // off the step's path]). Never empty while NVML works: an interval without a round of its own
  // takes the latest round's reading (the very first one reads on the spot).
  GpuSample take_interval();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// The caching allocator's peak of bytes allocated to tensors on `cuda_device` since the last
// reset (LibTorch's c10::cuda::CUDACachingAllocator statistics). It is below NVML's memory used,
// which also holds the allocator's cache, the CUDA context, NCCL's buffers and other processes.
// 0 in a build without CUDA. Call only on a rank that computes on that GPU.
int64_t allocator_peak_bytes(int cuda_device);
void reset_allocator_peak(int cuda_device);

// The smallest and the largest value over the ranks.
struct MinMax {
  double min = 0.0;
  double max = 0.0;
};

// Element-wise min and max of `values` over the ranks of `comm`, on every rank. Collective;
// every rank passes as many values. `label` names the collective if it stalls.
std::vector<MinMax> min_max_over_ranks(const std::vector<double>& values, Communicator& comm,
                                       const std::string& label = {});

// One log interval's GPU figures, spread over the ranks.
struct GpuSpread {
  MinMax utilization_pct;
  MinMax memory_used_bytes;
  MinMax power_w;
  MinMax allocator_peak_bytes;
  bool measured = false;  // some rank had NVML samples
  bool utilization_measured = false;  // and some rank's utilisation covers the interval

  // "GPU util 92-97%, mem 3.1-3.2 GB, power 310-330 W, peak alloc 1.2-1.2 GB" ("GPU util n/a"
  // for an interval shorter than the driver's utilisation sample period)
  std::string describe() const;
  // gpu_util_pct_min/_max, gpu_mem_used_bytes_min/_max, gpu_power_w_min/_max,
  // gpu_alloc_peak_bytes_min/_max
  nlohmann::json to_json() const;
};

// Collective over `comm`: every rank passes its own interval and allocator peak.
GpuSpread gpu_spread_over_ranks(const GpuSample& sample, int64_t allocator_peak_bytes,
                                Communicator& comm);

// The name CUDA gives `cuda_device` ("NVIDIA H200"); empty in a build without CUDA.
std::string cuda_device_name(int cuda_device);

// Dense (no 2:4 sparsity) peak FLOP/s of one GPU named `device_name` as CUDA names it, for
// arithmetic in `precision`; fp32 as TF32 on the tensor cores when `fp32_as_tf32`. 0 when the
// GPU is unknown (MFU is then not reported).
double peak_flops_per_s(const std::string& device_name, Precision precision, bool fp32_as_tf32);

// Model FLOPs utilisation: the FLOP/s the model's arithmetic needs at `samples_per_s` (over all
// `num_gpus`), as a fraction of their peak. 0 when the peak is unknown.
double model_flops_utilization(double training_flops_per_sample, double samples_per_s,
                               int num_gpus, double peak_flops_per_s_per_gpu);

}  // namespace hpc_train

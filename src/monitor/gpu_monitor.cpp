// GPU monitoring (gpu_monitor.h). The only file that knows NVML; it declares the few NVML entry
// points it uses itself, as NVML documents them, and loads them with dlopen. What it asks CUDA
// is in gpu_monitor_cuda.cpp (gpu_monitor_cpu.cpp in a build without CUDA).
#include "hpc_train/monitor/gpu_monitor.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "monitor/gpu_monitor_device.h"
#include "hpc_train/comm/comm.h"

namespace hpc_train {

namespace {

// NVML's C interface (nvml.h), only what the monitor needs. nvmlReturn_t is an enum whose
// success value is 0; nvmlDevice_t an opaque pointer.
using NvmlReturn = int;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr NvmlReturn kNvmlNotFound = 6;  // NVML_ERROR_NOT_FOUND
using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlUtilization {  // nvmlUtilization_t
  unsigned int gpu;       // percent of the last sample period in which a kernel ran
  unsigned int memory;
};
struct NvmlMemory {  // nvmlMemory_t
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
// nvmlDeviceGetSamples: the driver's own buffer of timestamped samples (nvmlSample_t), each value
// covering the driver's sample period up to its timestamp (microseconds of the host's clock).
constexpr int kNvmlGpuUtilizationSamples = 1;  // nvmlSamplingType_t NVML_GPU_UTILIZATION_SAMPLES
union NvmlValue {                              // nvmlValue_t, read as its nvmlValueType_t says
  double as_double;                            // 0
  unsigned int as_uint;                        // 1
  unsigned long as_ulong;                      // 2
  unsigned long long as_ulonglong;             // 3
  long long as_longlong;                       // 4
  int as_int;                                  // 5
  unsigned short as_ushort;                    // 6
};
struct NvmlSample {  // nvmlSample_t
  unsigned long long time_stamp_us;
  NvmlValue value;
};
static_assert(sizeof(NvmlSample) == 16, "nvmlSample_t is a timestamp and an 8-byte union");

double value_of(const NvmlValue& value, int value_type) {
  switch (value_type) {
    case 0: return value.as_double;
    case 1: return value.as_uint;
    case 2: return static_cast<double>(value.as_ulong);
    case 3: return static_cast<double>(value.as_ulonglong);
    case 4: return static_cast<double>(value.as_longlong);
    case 5: return value.as_int;
    case 6: return value.as_ushort;
    default: return std::numeric_limits<double>::quiet_NaN();
  }
}

uint64_t host_time_us() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

constexpr const char* kNvmlLibrary = "libnvidia-ml.so.1";  // comes with the driver

constexpr double kBytesPerGB = 1e9;

}  // namespace

class GpuMonitor::Impl {
 public:
  Impl(int cuda_device, double sample_interval_ms) : interval_ms_(sample_interval_ms) {
    if (cuda_device < 0) {
      reason_ = "this rank computes on the CPU";
      return;
    }
    if (!load_nvml()) return;
    if (!find_device(cuda_device)) return;
    // Optional (older drivers lack it): without it the polled readings stand.
    samples_ = reinterpret_cast<decltype(samples_)>(dlsym(library_, "nvmlDeviceGetSamples"));
    interval_start_us_ = host_time_us();
    thread_ = std::thread([this] { run(); });
  }

  ~Impl() {
    if (thread_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
      }
      wake_.notify_all();
      thread_.join();
    }
    if (initialized_) shutdown_();
    if (library_) dlclose(library_);
  }

  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  bool available() const { return reason_.empty(); }
  const std::string& reason() const { return reason_; }

  // Note [Monitor off the step's path]: only the first interval with no round of the thread
  // asks NVML here; every other answer comes from what the thread has read.
  GpuSample take_interval() {
    if (!available()) return {};
    std::unique_lock<std::mutex> lock(mutex_);
    if (sum_.rounds == 0) {
      if (!last_reading_) {
        lock.unlock();
        const Reading reading = read();
        lock.lock();
        last_reading_ = reading;
      }
      add(*last_reading_);
    }
    const std::optional<IntervalUtilization> buffered = utilization_from_fetched();
    GpuSample sample;
    sample.samples = sum_.rounds;
    if (buffered) {
      sample.utilization_pct = buffered->utilization_pct;
      sample.utilization_samples = buffered->samples;
    } else {  // the polled readings
      sample.utilization_samples = sum_.utilization_reads;
      sample.utilization_pct = sum_.utilization_reads > 0
                                   ? sum_.utilization_pct / sum_.utilization_reads
                                   : std::numeric_limits<double>::quiet_NaN();
    }
    sample.memory_used_bytes = sum_.memory_used_max_bytes;
    sample.power_w = sum_.power_reads > 0 ? sum_.power_w / sum_.power_reads : 0.0;
    sum_ = Sums{};
    return sample;
  }

 private:
  // One round of NVML queries; a query that fails (e.g. power on a board without a sensor)
  // leaves its field out.
  struct Reading {
    bool has_utilization = false;
    double utilization_pct = 0.0;
    bool has_memory = false;
    int64_t memory_used_bytes = 0;
    bool has_power = false;
    double power_w = 0.0;
  };
  struct Sums {
    int64_t rounds = 0;
    int64_t utilization_reads = 0;
    double utilization_pct = 0.0;
    int64_t memory_used_max_bytes = 0;
    int64_t power_reads = 0;
    double power_w = 0.0;
  };

  template <typename Function>
  bool resolve(Function& function, const char* symbol) {
    function = reinterpret_cast<Function>(dlsym(library_, symbol));
    if (!function) reason_ = std::string(kNvmlLibrary) + " has no " + symbol + " (driver too old)";
    return function != nullptr;
  }

  bool load_nvml() {
    library_ = dlopen(kNvmlLibrary, RTLD_NOW | RTLD_LOCAL);
    if (!library_) {
      const char* error = dlerror();
      reason_ = error ? error : std::string(kNvmlLibrary) + " not found";
      return false;
    }
    if (!resolve(init_, "nvmlInit_v2") || !resolve(shutdown_, "nvmlShutdown") ||
        !resolve(error_string_, "nvmlErrorString") ||
        !resolve(handle_by_pci_bus_id_, "nvmlDeviceGetHandleByPciBusId_v2") ||
        !resolve(utilization_rates_, "nvmlDeviceGetUtilizationRates") ||
        !resolve(memory_info_, "nvmlDeviceGetMemoryInfo") ||
        !resolve(power_usage_, "nvmlDeviceGetPowerUsage"))
      return false;
    const NvmlReturn rc = init_();
    if (rc != kNvmlSuccess) {
      reason_ = std::string("nvmlInit_v2 failed: ") + error_string_(rc);
      return false;
    }
    initialized_ = true;
    return true;
  }

  // CUDA_VISIBLE_DEVICES renumbers the GPUs for CUDA, not for NVML: the PCI bus id is what both
  // agree on.
  bool find_device(int cuda_device) {
    const std::string bus_id = cuda_pci_bus_id(cuda_device, reason_);
    if (bus_id.empty()) return false;
    const NvmlReturn rc = handle_by_pci_bus_id_(bus_id.c_str(), &device_);
    if (rc != kNvmlSuccess) {
      reason_ = "nvmlDeviceGetHandleByPciBusId_v2(" + bus_id + ") failed: " + error_string_(rc);
      return false;
    }
    return true;
  }

  Reading read() const {
    Reading reading;
    NvmlUtilization utilization{};
    if (utilization_rates_(device_, &utilization) == kNvmlSuccess) {
      reading.has_utilization = true;
      reading.utilization_pct = utilization.gpu;
    }
    NvmlMemory memory{};
    if (memory_info_(device_, &memory) == kNvmlSuccess) {
      reading.has_memory = true;
      reading.memory_used_bytes = static_cast<int64_t>(memory.used);
    }
    unsigned int power_mw = 0;
    if (power_usage_(device_, &power_mw) == kNvmlSuccess) {
      reading.has_power = true;
      reading.power_w = power_mw / 1e3;
    }
    return reading;
  }

  void add(const Reading& reading) {  // under mutex_
    ++sum_.rounds;
    if (reading.has_utilization) {
      ++sum_.utilization_reads;
      sum_.utilization_pct += reading.utilization_pct;
    }
    if (reading.has_memory)
      sum_.memory_used_max_bytes = std::max(sum_.memory_used_max_bytes, reading.memory_used_bytes);
    if (reading.has_power) {
      ++sum_.power_reads;
      sum_.power_w += reading.power_w;
    }
  }

  // Note [Utilisation over the interval]: the mean of the driver's utilisation samples whose
  // periods end within the interval, read from its sample buffer, rather than the polled
  // nvmlDeviceGetUtilizationRates, whose one value covers the driver's last sample period and so
  // can reach back before the interval. An interval that holds no sample end is shorter than
  // the driver's sample period, as a log interval of 100 steps of a small network can be
  // (bench/results-notes.md, Note [Utilisation over the interval]): the sample that will cover it
  // is not written yet, and every sample there is describes time before the interval, so its
  // utilisation is unknown (NaN), not the newest sample's (which, while steps were replaying back
  // to back, showed the GPU idling before training started). Which samples fall in an interval,
  // and what one without any reports, is utilization_over_interval's to say (a pure function,
  // tested on the CPU). The thread reads the buffer (fetch_samples) and the interval ends where
  // its last reading did (Note [Monitor off the step's path]). NVML answers
  // NVML_ERROR_NOT_FOUND where the buffer holds no sample after the one last seen (as between
  // two readings microseconds apart, or while an idle GPU's buffer runs dry): that is an empty
  // reading, not a failed one, and the polled value put in its place would describe the driver's
  // last period, before the interval.

  // By the thread: the driver's samples since the last one seen, into `fetched`; false where the
  // buffer cannot be read (then the polled means stand).
  bool fetch_samples(std::vector<UtilizationSample>& fetched) {
    if (!samples_) return false;
    int value_type = 0;
    unsigned int count = 0;
    NvmlReturn rc =
        samples_(device_, kNvmlGpuUtilizationSamples, last_seen_us_, &value_type, &count, nullptr);
    if (rc == kNvmlSuccess && count > 0) {
      std::vector<NvmlSample> buffer(count);
      rc = samples_(device_, kNvmlGpuUtilizationSamples, last_seen_us_, &value_type, &count,
                    buffer.data());
      if (rc == kNvmlSuccess) {
        buffer.resize(std::min<size_t>(count, buffer.size()));
        for (const NvmlSample& s : buffer) {
          fetched.push_back({s.time_stamp_us, value_of(s.value, value_type)});
          last_seen_us_ = std::max<uint64_t>(last_seen_us_, s.time_stamp_us);
        }
      }
    }
    return rc == kNvmlSuccess || rc == kNvmlNotFound;
  }

  // Under mutex_: the interval from the previous one's end to the thread's last reading of the
  // buffer, out of the samples it fetched; samples stamped after that stay for the next one.
  // nullopt where the buffer cannot be read.
  std::optional<IntervalUtilization> utilization_from_fetched() {
    if (!buffer_readable_) return std::nullopt;
    const uint64_t end_us = std::max(interval_start_us_, fetched_through_us_);
    const IntervalUtilization interval =
        utilization_over_interval(fetched_, interval_start_us_, end_us);
    fetched_.erase(std::remove_if(fetched_.begin(), fetched_.end(),
                                  [&](const UtilizationSample& s) { return s.time_stamp_us <= end_us; }),
                   fetched_.end());
    interval_start_us_ = end_us;
    return interval;
  }

  void run() {
    const auto period = std::chrono::duration<double, std::milli>(interval_ms_);
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, period, [this] { return stop_; })) {
      lock.unlock();
      // NVML is thread-safe; no lock held while it answers.
      const Reading reading = read();
      const uint64_t fetch_start_us = host_time_us();
      std::vector<UtilizationSample> fetched;
      const bool readable = fetch_samples(fetched);
      lock.lock();
      add(reading);
      last_reading_ = reading;
      buffer_readable_ = readable;
      // The driver's samples up to the fetch's start are in: the interval may end there.
      if (readable) fetched_through_us_ = fetch_start_us;
      fetched_.insert(fetched_.end(), fetched.begin(), fetched.end());
    }
  }

  double interval_ms_;
  std::string reason_;
  void* library_ = nullptr;
  bool initialized_ = false;
  NvmlReturn (*init_)() = nullptr;
  NvmlReturn (*shutdown_)() = nullptr;
  const char* (*error_string_)(NvmlReturn) = nullptr;
  NvmlReturn (*handle_by_pci_bus_id_)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*utilization_rates_)(NvmlDevice, NvmlUtilization*) = nullptr;
  NvmlReturn (*memory_info_)(NvmlDevice, NvmlMemory*) = nullptr;
  NvmlReturn (*power_usage_)(NvmlDevice, unsigned int*) = nullptr;  // milliwatts
  NvmlReturn (*samples_)(NvmlDevice, int, unsigned long long, int*, unsigned int*,
                         NvmlSample*) = nullptr;  // nvmlDeviceGetSamples, when the driver has it
  NvmlDevice device_ = nullptr;
  uint64_t last_seen_us_ = 0;  // the thread's: the newest sample's time stamp it has fetched
  std::mutex mutex_;
  // Under mutex_ (Note [Utilisation over the interval], Note [Monitor off the step's path]):
  // where the current interval began, the samples fetched and not yet counted, how far the
  // buffer has been read, whether its last reading worked, and the thread's latest round.
  uint64_t interval_start_us_ = 0;
  std::vector<UtilizationSample> fetched_;
  uint64_t fetched_through_us_ = 0;
  bool buffer_readable_ = false;
  std::optional<Reading> last_reading_;
  std::condition_variable wake_;
  bool stop_ = false;
  Sums sum_;
  std::thread thread_;
};

IntervalUtilization utilization_over_interval(const std::vector<UtilizationSample>& samples,
                                              uint64_t start_us, uint64_t end_us,
                                              uint64_t seen_through_us) {
  IntervalUtilization interval;
  interval.seen_through_us = seen_through_us;
  double sum_pct = 0.0;
  for (const UtilizationSample& s : samples) {
    if (s.time_stamp_us > end_us) continue;  // the next interval's
    interval.seen_through_us = std::max(interval.seen_through_us, s.time_stamp_us);
    if (s.time_stamp_us <= start_us || std::isnan(s.utilization_pct)) continue;
    sum_pct += s.utilization_pct;
    ++interval.samples;
  }
  interval.utilization_pct = interval.samples > 0
                                 ? sum_pct / static_cast<double>(interval.samples)
                                 : std::numeric_limits<double>::quiet_NaN();
  return interval;
}

GpuMonitor::GpuMonitor(int cuda_device, double sample_interval_ms)
    : impl_(std::make_unique<Impl>(cuda_device, sample_interval_ms)) {}
GpuMonitor::~GpuMonitor() = default;
GpuMonitor::GpuMonitor(GpuMonitor&&) noexcept = default;
GpuMonitor& GpuMonitor::operator=(GpuMonitor&&) noexcept = default;

bool GpuMonitor::available() const { return impl_ && impl_->available(); }

const std::string& GpuMonitor::unavailable_reason() const {
  static const std::string moved_from = "moved from";
  return impl_ ? impl_->reason() : moved_from;
}

GpuSample GpuMonitor::take_interval() { return impl_ ? impl_->take_interval() : GpuSample{}; }

// MPI has no min-and-max in one operation: the max of (v, -v) gives max v and -min v, one
// collective instead of two. A NaN (left out) enters both halves as -infinity.
std::vector<MinMax> min_max_over_ranks(const std::vector<double>& values, Communicator& comm,
                                       const std::string& label) {
  const size_t n = values.size();
  constexpr double kLeftOut = -std::numeric_limits<double>::infinity();
  std::vector<double> global(2 * n);  // this rank's, until reduced
  for (size_t i = 0; i < n; ++i) {
    global[i] = std::isnan(values[i]) ? kLeftOut : values[i];
    global[n + i] = std::isnan(values[i]) ? kLeftOut : -values[i];
  }
  comm.all_reduce_doubles(global, ReduceOp::kMax, label);
  std::vector<MinMax> result(n);
  for (size_t i = 0; i < n; ++i)
    if (global[i] != kLeftOut) result[i] = {-global[n + i], global[i]};
  return result;
}

GpuSpread gpu_spread_over_ranks(const GpuSample& sample, int64_t allocator_peak_bytes,
                                Communicator& comm) {
  // A rank without NVML samples is left out of the NVML figures, not counted as an idle GPU.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const bool measured = sample.samples > 0;
  const std::vector<MinMax> spread = min_max_over_ranks(
      {measured ? sample.utilization_pct : nan,
       measured ? static_cast<double>(sample.memory_used_bytes) : nan,
       measured ? sample.power_w : nan, static_cast<double>(allocator_peak_bytes),
       static_cast<double>(sample.samples),
       measured && !std::isnan(sample.utilization_pct) ? 1.0 : 0.0},
      comm, "GPU figures");
  GpuSpread result;
  result.utilization_pct = spread[0];
  result.memory_used_bytes = spread[1];
  result.power_w = spread[2];
  result.allocator_peak_bytes = spread[3];
  result.measured = spread[4].max > 0;
  result.utilization_measured = spread[5].max > 0;
  return result;
}

std::string GpuSpread::describe() const {
  char utilization[32] = "n/a";
  if (utilization_measured)
    std::snprintf(utilization, sizeof(utilization), "%.0f-%.0f%%", utilization_pct.min,
                  utilization_pct.max);
  char text[256];
  const int allocator_at = measured
      ? std::snprintf(text, sizeof(text), "GPU util %s, mem %.1f-%.1f GB, power %.0f-%.0f W, ",
                      utilization, memory_used_bytes.min / kBytesPerGB,
                      memory_used_bytes.max / kBytesPerGB, power_w.min, power_w.max)
      : 0;
  std::snprintf(text + allocator_at, sizeof(text) - allocator_at, "peak alloc %.1f-%.1f GB",
                allocator_peak_bytes.min / kBytesPerGB, allocator_peak_bytes.max / kBytesPerGB);
  return text;
}

nlohmann::json GpuSpread::to_json() const {
  const auto nvml = [this](double value) { return measured ? nlohmann::json(value) : nlohmann::json(); };
  const auto utilization = [this](double value) {
    return utilization_measured ? nlohmann::json(value) : nlohmann::json();
  };
  return {{"gpu_util_pct_min", utilization(utilization_pct.min)},
          {"gpu_util_pct_max", utilization(utilization_pct.max)},
          {"gpu_mem_used_bytes_min", nvml(memory_used_bytes.min)},
          {"gpu_mem_used_bytes_max", nvml(memory_used_bytes.max)},
          {"gpu_power_w_min", nvml(power_w.min)},
          {"gpu_power_w_max", nvml(power_w.max)},
          {"gpu_alloc_peak_bytes_min", allocator_peak_bytes.min},
          {"gpu_alloc_peak_bytes_max", allocator_peak_bytes.max}};
}

// Dense peaks of the H100 SXM5, which the H200 SXM shares (same GH100 chip and clocks; the H200
// differs in memory). NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), table
// "NVIDIA H100 SXM5": FP16 and BF16 Tensor 989.4 TFLOPS, TF32 Tensor 494.7 TFLOPS (twice that
// with sparsity), FP32 66.9 TFLOPS. The H200 datasheet
// (https://www.nvidia.com/en-us/data-center/h200/) lists the sparse figures: BF16/FP16
// 1,979 TFLOPS, TF32 989 TFLOPS, and FP32 67 TFLOPS. PCIe and NVL boards run lower clocks and
// power, so they are not matched here.
double peak_flops_per_s(const std::string& device_name, Precision precision, bool fp32_as_tf32) {
  const bool hopper_sxm = (device_name.find("H100") != std::string::npos ||
                           device_name.find("H200") != std::string::npos) &&
                          device_name.find("GH200") == std::string::npos &&
                          device_name.find("PCIe") == std::string::npos &&
                          device_name.find("NVL") == std::string::npos;
  if (!hopper_sxm) return 0.0;
  switch (precision) {
    case Precision::kBf16:
    case Precision::kFp16:
      return 989.4e12;
    case Precision::kFp32:
      return fp32_as_tf32 ? 494.7e12 : 66.9e12;
  }
  return 0.0;
}

double model_flops_utilization(double training_flops_per_sample, double samples_per_s,
                               int num_gpus, double peak_flops_per_s_per_gpu) {
  if (peak_flops_per_s_per_gpu <= 0.0 || num_gpus <= 0) return 0.0;
  return training_flops_per_sample * samples_per_s / (num_gpus * peak_flops_per_s_per_gpu);
}

}  // namespace hpc_train

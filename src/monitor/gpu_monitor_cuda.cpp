// The GPU monitor's questions to CUDA (gpu_monitor.h, gpu_monitor_device.h) in a build whose
// LibTorch has CUDA: the caching allocator's statistics, the device's name and PCI bus id. A
// build without CUDA has gpu_monitor_cpu.cpp instead.
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "monitor/gpu_monitor_device.h"
#include "hpc_train/monitor/gpu_monitor.h"

namespace hpc_train {

// Index 0 of a StatArray is the aggregate over the small and large pools (StatType::AGGREGATE,
// whose namespace differs between LibTorch 1.13 and 2.x, hence the number).
constexpr size_t kAggregateStat = 0;

int64_t allocator_peak_bytes(int cuda_device) {
  const auto stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(cuda_device));
  return stats.allocated_bytes[kAggregateStat].peak;
}

void reset_allocator_peak(int cuda_device) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(cuda_device));
}

std::string cuda_device_name(int cuda_device) {
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, cuda_device) != cudaSuccess) return {};
  return properties.name;
}

std::string cuda_pci_bus_id(int cuda_device, std::string& why_not) {
  char bus_id[32] = {};
  const cudaError_t cuda_rc = cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), cuda_device);
  if (cuda_rc != cudaSuccess) {
    why_not = "cudaDeviceGetPCIBusId(" + std::to_string(cuda_device) +
              ") failed: " + cudaGetErrorString(cuda_rc);
    return {};
  }
  return bus_id;
}

}  // namespace hpc_train

// The GPU monitor's questions to CUDA (gpu_monitor.h, gpu_monitor_device.h) in a build without
// CUDA: no allocator statistics, no device name, no bus id to find a GPU in NVML by. A build
// whose LibTorch has CUDA has gpu_monitor_cuda.cpp instead.
#include <cstdint>
#include <string>

#include "monitor/gpu_monitor_device.h"
#include "hpc_train/monitor/gpu_monitor.h"

namespace hpc_train {

int64_t allocator_peak_bytes(int) { return 0; }
void reset_allocator_peak(int) {}
std::string cuda_device_name(int) { return {}; }

std::string cuda_pci_bus_id(int, std::string& why_not) {
  why_not = "this hpc_train was built without CUDA";
  return {};
}

}  // namespace hpc_train

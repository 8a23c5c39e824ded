// What the GPU monitor asks CUDA besides gpu_monitor.h's allocator_peak_bytes,
// reset_allocator_peak and cuda_device_name (private to the monitor). gpu_monitor_cuda.cpp
// answers in a build whose LibTorch has CUDA, gpu_monitor_cpu.cpp in one without; CMake picks
// one of the two.
#pragma once

#include <string>

namespace hpc_train {

// The PCI bus id of `cuda_device` as CUDA numbers it in this process ("00000000:1B:00.0"): what
// NVML finds the same GPU by, since CUDA_VISIBLE_DEVICES renumbers GPUs for CUDA only. Empty,
// with `why_not` saying why, where there is none: CUDA failed, or this build has no CUDA. Never
// throws.
std::string cuda_pci_bus_id(int cuda_device, std::string& why_not);

}  // namespace hpc_train

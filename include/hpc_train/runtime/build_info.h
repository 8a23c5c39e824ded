// What this binary was built from and with, and what it runs on: the answer to "which NCCL,
// which cuDNN, which MPI is this?" that DeepSpeed's ds_report and `horovodrun --check-build`
// give. `hpc_train --version` prints it; the run log's header and summary.json carry it, so a
// result can be traced to its build.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hpc_train {

struct BuildItem {
  std::string key;    // summary.json's name, e.g. "nccl"
  std::string label;  // the printed name, e.g. "NCCL"
  std::string value;  // e.g. "2.28.3"; "none" where the build has no such part
};

// Every item: hpc_train's version and commit, LibTorch, the CUDA runtime and driver, cuDNN,
// NCCL and the CUDA architectures compiled (or "none" in a CPU build), the MPI library, HDF5
// (and whether it is parallel), Boost, the compiler and the build type. Queries the libraries
// it runs with where they can say (MPI, HDF5, CUDA, cuDNN, NCCL); the rest is fixed at build
// time. Needs no GPU and may run before MPI_Init.
std::vector<BuildItem> build_report();

// "hpc_train 0.1.0 (commit abc1234)" and one "  label  value" line per other item.
std::string format_build_report(const std::vector<BuildItem>& items);

// {key: value, ...}
nlohmann::json build_report_json(const std::vector<BuildItem>& items);

// The CUDA part of build_report (build_info_cuda.cpp, or build_info_cpu.cpp in a CPU build).
std::vector<BuildItem> cuda_build_items();

}  // namespace hpc_train

#include "hpc_train/runtime/build_info.h"

#include <cstdio>
#include <sstream>

#include <H5public.h>
#include <boost/version.hpp>
#include <mpi.h>
#include <torch/version.h>

#include "build_commit.h"  // generated at every build (cmake/WriteBuildCommit.cmake)

namespace hpc_train {
namespace {

// The library's own version string (MPI_Get_library_version may be called before MPI_Init),
// up to its first comma or line end: "Open MPI v4.1.4" rather than its package and repository.
std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  if (MPI_Get_library_version(text, &length) != MPI_SUCCESS) return "unknown";
  std::string version(text, static_cast<size_t>(length));
  version = version.substr(0, version.find_first_of(",\n"));
  int major = 0, minor = 0;
  MPI_Get_version(&major, &minor);
  return version + " (MPI " + std::to_string(major) + "." + std::to_string(minor) + ")";
}

// The HDF5 library loaded (which can differ from the headers compiled against), and whether
// the build uses its parallel (MPI-IO) variant.
std::string hdf5_version() {
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  std::string version =
      std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
#ifdef HPC_TRAIN_HDF5_PARALLEL
  return version + " (parallel)";
#else
  return version + " (serial)";
#endif
}

std::string compiler() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("gcc ") + __VERSION__;
#else
  return "unknown";
#endif
}

}  // namespace

std::vector<BuildItem> build_report() {
  std::vector<BuildItem> items = {
      {"hpc_train", "hpc_train", HPC_TRAIN_VERSION},
      {"commit", "commit", HPC_TRAIN_BUILD_COMMIT},
      {"libtorch", "LibTorch", TORCH_VERSION},
  };
  for (BuildItem& item : cuda_build_items()) items.push_back(std::move(item));
  const std::string boost = std::to_string(BOOST_VERSION / 100000) + "." +
                            std::to_string(BOOST_VERSION / 100 % 1000) + "." +
                            std::to_string(BOOST_VERSION % 100);
  items.push_back({"mpi", "MPI", mpi_library_version()});
  items.push_back({"hdf5", "HDF5", hdf5_version()});
  items.push_back({"boost", "Boost", boost});
  items.push_back({"compiler", "compiler", compiler()});
  items.push_back({"build_type", "build type", HPC_TRAIN_BUILD_TYPE});
  return items;
}

std::string format_build_report(const std::vector<BuildItem>& items) {
  std::ostringstream text;
  std::string version, commit;
  for (const BuildItem& item : items) {
    if (item.key == "hpc_train") version = item.value;
    if (item.key == "commit") commit = item.value;
  }
  text << "hpc_train " << version << " (commit " << commit << ")\n";
  for (const BuildItem& item : items) {
    if (item.key == "hpc_train" || item.key == "commit") continue;
    char line[64];
    std::snprintf(line, sizeof line, "  %-20s ", item.label.c_str());
    text << line << item.value << "\n";
  }
  return text.str();
}

nlohmann::json build_report_json(const std::vector<BuildItem>& items) {
  nlohmann::json record = nlohmann::json::object();
  for (const BuildItem& item : items) record[item.key] = item.value;
  return record;
}

}  // namespace hpc_train

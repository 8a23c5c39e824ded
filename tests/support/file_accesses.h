// The ways a rank may open a dataset file in this build, for tests that try each.
#pragma once

#include <mpi.h>

#include <vector>

#include "hpc_train/data/dataset_file.h"

namespace test_support {

inline bool thread_multiple() {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  return level >= MPI_THREAD_MULTIPLE;
}

// Both accesses where this build has them: kMpiIo needs a parallel HDF5 and MPI_THREAD_MULTIPLE.
inline std::vector<hpc_train::FileAccess> accesses() {
  std::vector<hpc_train::FileAccess> all = {hpc_train::FileAccess::kSerial};
  if (hpc_train::preferred_file_access(thread_multiple()) == hpc_train::FileAccess::kMpiIo)
    all.push_back(hpc_train::FileAccess::kMpiIo);
  return all;
}

inline const char* access_name(hpc_train::FileAccess access) {
  return access == hpc_train::FileAccess::kMpiIo ? "MPI-IO" : "serial";
}

}  // namespace test_support

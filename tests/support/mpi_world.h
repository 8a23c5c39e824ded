// This process's place in MPI_COMM_WORLD, for tests that run at several rank counts.
#pragma once

#include <mpi.h>

namespace test_support {

inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

inline int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

}  // namespace test_support

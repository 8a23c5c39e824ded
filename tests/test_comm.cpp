// Communicator collectives with closed-form results, at 1, 2 and 3 ranks.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "hpc_train/comm.h"
#include "hpc_train/error.h"

using hpc_train::Communicator;
using hpc_train::ReduceOp;

TEST(Communicator, AllReduceSumsRankValues) {
  Communicator comm(MPI_COMM_WORLD);
  const int n = comm.size();
  at::Tensor t = at::arange(7, at::kFloat) + comm.rank();
  comm.all_reduce(t).wait();
  // sum over r of (i + r) = n*i + n(n-1)/2
  const at::Tensor expected = at::arange(7, at::kFloat) * n + n * (n - 1) / 2.0;
  EXPECT_TRUE(at::equal(t, expected));
}

TEST(Communicator, AllReduceMaxAndInt64) {
  Communicator comm(MPI_COMM_WORLD);
  at::Tensor t = at::full({3}, comm.rank(), at::kLong);
  comm.all_reduce(t, ReduceOp::kMax).wait();
  EXPECT_EQ(t[2].item<int64_t>(), comm.size() - 1);
}

TEST(Communicator, AsyncWorkCanBeTested) {
  Communicator comm(MPI_COMM_WORLD);
  at::Tensor t = at::ones({1000}, at::kDouble);
  hpc_train::Work work = comm.all_reduce(t);
  while (!work.test()) {
  }
  EXPECT_DOUBLE_EQ(t.sum().item<double>(), 1000.0 * comm.size());
}

TEST(Communicator, BroadcastFromRoot) {
  Communicator comm(MPI_COMM_WORLD);
  const int root = comm.size() - 1;
  at::Tensor t = at::full({5}, comm.rank() == root ? 42.0f : -1.0f);
  comm.broadcast(t, root).wait();
  EXPECT_TRUE(at::equal(t, at::full({5}, 42.0f)));
}

TEST(Communicator, Scalars) {
  Communicator comm(MPI_COMM_WORLD);
  EXPECT_DOUBLE_EQ(comm.all_reduce_scalar(0.5), 0.5 * comm.size());
  EXPECT_EQ(comm.all_reduce_count(comm.rank(), ReduceOp::kMin), 0);
}

TEST(Communicator, RejectsNonContiguous) {
  Communicator comm(MPI_COMM_WORLD);
  at::Tensor t = at::zeros({4, 4}).t();
  EXPECT_THROW(comm.all_reduce(t), hpc_train::Error);
}

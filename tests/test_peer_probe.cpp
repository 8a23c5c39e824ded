// Note [Naming a lost peer] (peer_probe.h): every rank answers while it lives; a rank whose
// socket is gone (as when its process is) is named, with its host, by every other rank; one rank
// has nobody to ask. Run at 1 and 3 ranks.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "hpc_train/comm/peer_probe.h"

namespace {

using hpc_train::PeerProbe;
using std::chrono::milliseconds;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}
int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

TEST(PeerProbe, EveryLivingRankAnswers) {
  const PeerProbe probe(MPI_COMM_WORLD);
  EXPECT_TRUE(probe.silent_peers(milliseconds(2000)).empty());
  if (world_size() == 1) EXPECT_EQ(probe.describe(milliseconds(2000)), "");
  else EXPECT_EQ(probe.describe(milliseconds(2000)), "; every other rank answers on the network");
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(PeerProbe, AGoneRankIsNamedWithItsHost) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks";
  PeerProbe probe(MPI_COMM_WORLD);
  const int gone = world_size() - 1;
  if (world_rank() == gone) probe.close_for_test();
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() != gone) {
    const auto silent = probe.silent_peers(milliseconds(2000));
    ASSERT_EQ(silent.size(), 1u);
    EXPECT_EQ(silent[0].rank, gone);
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    EXPECT_EQ(silent[0].host, host);  // every rank of this test runs here
    // A live host with no listener refuses at once.
    EXPECT_EQ(silent[0].why, "Connection refused");
    EXPECT_EQ(probe.describe(milliseconds(2000)),
              "; rank " + std::to_string(gone) + "@" + host +
                  " does not answer (Connection refused)");
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace

// Note [Stop agreement]: the ranks' answers after step N are acted on after step N+1, alike on
// every rank, and posting them never waits for another rank: rank 1 posts its first answers
// only after rank 0 has returned from its first post (with a blocking agreement per step, rank 0
// would wait there for rank 1, which waits for rank 0: the test would hang until its timeout).
// At 1 rank the answers are acted on at once.
#include <gtest/gtest.h>
#include <mpi.h>

#include <csignal>

#include "hpc_train/comm/comm.h"
#include "hpc_train/train/step_agreement.h"

using hpc_train::Communicator;
using hpc_train::StepAgreement;

TEST(StepAgreement, ActsOnEveryRanksAnswersOneStepLater) {
  Communicator comm(MPI_COMM_WORLD);
  StepAgreement agreement(comm);
  const int rank = comm.rank();
  const int last = comm.size() - 1;
  const bool alone = comm.size() == 1;
  // Rank 1 is held back until rank 0 has posted once (a point-to-point message, not part of the
  // agreement).
  if (rank == 1) MPI_Recv(nullptr, 0, MPI_BYTE, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  // Step 1: nothing received anywhere; rank 0's clock has run out.
  StepAgreement::Agreed agreed = agreement.after_step(0, rank == 0);
  EXPECT_EQ(agreed.stop_signal, 0);
  EXPECT_EQ(agreed.checkpoint_minutes_elapsed, alone);  // acted on at once only alone
  if (rank == 0 && comm.size() > 1) MPI_Send(nullptr, 0, MPI_BYTE, 1, 7, MPI_COMM_WORLD);
  // Step 2: the last rank has received SIGUSR1; its clock has run out, which does not count
  // (only rank 0's does).
  agreed = agreement.after_step(rank == last ? SIGUSR1 : 0, rank == last && rank != 0);
  EXPECT_EQ(agreed.stop_signal, alone ? SIGUSR1 : 0);
  EXPECT_TRUE(agreed.checkpoint_minutes_elapsed || alone) << "step 1's clock, agreed after step 2";
  // Step 3: step 2's signal, on every rank.
  agreed = agreement.after_step(0, false);
  EXPECT_EQ(agreed.stop_signal, alone ? 0 : SIGUSR1);
  EXPECT_FALSE(agreed.checkpoint_minutes_elapsed);
  agreement.finish();
}

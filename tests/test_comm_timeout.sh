#!/usr/bin/env bash
# The communication watchdog (Note [Communication watchdog] in comm.h), with a 2 s timeout: a
# collective that cannot finish must end the job within a few seconds, with a non-zero exit and
# one line that names rank 0, the operation, its label and bytes, and the backend, and with
# several ranks whether the others still answer on the network (Note [Naming a lost peer]).
#   mpi (default), 2 ranks: rank 1 never joins what rank 0 started, while rank 0 waits for the
#     collective, is busy elsewhere, or blocks in a scalar reduction or a string broadcast
#     (whose root is rank 1); 1 rank: work registered with Communicator::watch (as a CUDA graph
#     replay is) never finishes.
#   COMM_TIMEOUT_BACKEND=nccl (GPU build), 1 rank: the collective is queued behind a stream
#     that is held up for longer than the timeout.
set -euo pipefail
work="$HPC_TRAIN_TEST_WORK"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0
# From the start of the stall (the test prints when) to the end of the job: the 2 s timeout,
# a 0.1 s poll, and MPI_Abort tearing down the ranks on a busy 2-core machine. With NCCL, add
# the 5 s grace for ncclCommAbort (kBackendAbortGrace in comm.cpp), which this stall uses up:
# the stream it would wait for is held up on the host.
max_ms=8000
[ "${COMM_TIMEOUT_BACKEND:-mpi}" = nccl ] && max_ms=13000

# expect_stall RANKS NAME TEXT: runs the disabled test case NAME of $TEST_COMM.
expect_stall() {
  local ranks=$1 name=$2 text=$3 rc stall_ms end_ms elapsed_ms
  set +e
  timeout 60 "$MPIEXEC" -np "$ranks" --oversubscribe "$TEST_COMM" --gtest_also_run_disabled_tests \
    --gtest_filter="*.DISABLED_$name" > "$name.out" 2> "$name.err"
  rc=$?
  set -e
  end_ms=$(date +%s%3N)
  stall_ms=$(sed -n 's/^stall begins at \([0-9]*\) ms$/\1/p' "$name.out" | head -n 1)
  elapsed_ms=$(( end_ms - ${stall_ms:-0} ))
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ -z "$stall_ms" ] || [ "$elapsed_ms" -gt "$max_ms" ] ||
     ! grep -qE "^\[rank 0@[^]]+\] $text" "$name.err"; then
    echo "FAIL $name: exit $rc (want non-zero, not 124), ${elapsed_ms} ms after the stall began" \
         "(want <= ${max_ms}), stdout and stderr:"
    cat "$name.out" "$name.err"
    failures=$((failures + 1))
  else
    echo "ok   $name: exit $rc, ${elapsed_ms} ms after the stall began:" \
         "$(grep -E "^\[rank 0@" "$name.err" | head -n 1)"
  fi
}

if [ "${COMM_TIMEOUT_BACKEND:-mpi}" = nccl ]; then
  expect_stall 1 StalledNcclOperationEndsTheJob \
    "comm: all_reduce of bucket 9 \(28 B\) did not finish within 2 s \(backend nccl\)"
else
  # Rank 1 lives: the probe finds it answering.
  answers="; every other rank answers on the network\$"
  expect_stall 2 StalledWaitEndsTheJob \
    "comm: all_reduce of bucket 7 \(28 B\) did not finish within 2 s \(backend mpi\)$answers"
  expect_stall 2 StalledWhileBusyEndsTheJob \
    "comm: reduce_scatter of bucket 8 \(64 B\) did not finish within 2 s \(backend mpi\)$answers"
  expect_stall 2 StalledScalarEndsTheJob \
    "comm: all_reduce of loss \(8 B\) did not finish within 2 s \(backend mpi\)$answers"
  expect_stall 2 StalledStringBroadcastEndsTheJob \
    "comm: broadcast of checkpoint to resume \(8 B\) did not finish within 2 s \(backend mpi\)$answers"
  expect_stall 1 StalledWatchedWorkEndsTheJob \
    "comm: graph replay of step 4 did not finish within 2 s \(backend mpi\)$"
fi

[ "$failures" -eq 0 ] && echo "all stalls ended the job" || { echo "$failures stall case(s) failed"; exit 1; }

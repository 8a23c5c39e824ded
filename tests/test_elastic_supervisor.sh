#!/usr/bin/env bash
# hpc_train_elastic's decisions, without Slurm (--hosts): a node that mpirun cannot reach is
# found lost and the run starts again on the nodes left; a run that fails while every node
# answers is not restarted, nor one that ends with hpc_train's usage error; fewer nodes left than
# --min-nodes ends the job; bad usage exits 2. "lostnode" is a host that Open MPI's launcher
# cannot reach (an rsh agent of the test's that fails, as ssh to a dead node does); localhost is
# started by mpirun itself. The three-node cluster test (test_cluster_node_loss) loses real nodes.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"
elastic=${HPC_TRAIN_ELASTIC:?}

printf '#!/bin/sh\necho "no route to $*" >&2\nexit 255\n' > unreachable-agent
chmod +x unreachable-agent
mpirun_args="--oversubscribe --mca plm_rsh_agent $work/unreachable-agent"
"$HPC_TRAIN_WRITE_SYNTHETIC_DATASET" tiny.h5 64 1 28 28 > /dev/null
training=(--dataset tiny.h5 --epochs 1 --micro-batch 8 --max-steps 3 --threads-per-rank 1
          --progress lines)

# attempts RUN_DIR: the outcome of every attempt in its elastic.jsonl, one per line.
attempts() { sed -n 's/.*"outcome":"\([^"]*\)".*/\1/p' "$1/elastic.jsonl"; }

# 1. A node lost: the run goes on on localhost, from scratch (no checkpoint yet).
status=0
"$elastic" --hosts localhost,lostnode --min-nodes 1 --max-restarts 2 --probe-timeout 10 \
  --mpirun-args "$mpirun_args" -- "$HPC_TRAIN" "${training[@]}" --run-dir lost \
  > lost.out 2>&1 || status=$?
cat lost.out
[ "$status" = 0 ] || fail "a lost node: exit $status, want 0"
grep -q "lost: lostnode (rank 1); left: localhost" lost.out || fail "a lost node: not named"
[ "$(attempts lost | tr '\n' '|')" = "restart 1|finished|" ] ||
  fail "a lost node: attempts $(attempts lost | tr '\n' '|')"
grep -q '"attempt":2,"nodes":\["localhost"\],"ranks":1,"exit_status":0' lost/elastic.jsonl ||
  fail "a lost node: the second attempt did not run on localhost alone"

# 2. Fewer nodes left than --min-nodes.
status=0
"$elastic" --hosts localhost,lostnode --min-nodes 2 --probe-timeout 10 \
  --mpirun-args "$mpirun_args" -- "$HPC_TRAIN" "${training[@]}" --run-dir few > few.out 2>&1 ||
  status=$?
[ "$status" = 1 ] || { cat few.out; fail "below --min-nodes: exit $status, want 1"; }
grep -q "1 node(s) left, fewer than --min-nodes 2: giving up" few.out ||
  { cat few.out; fail "below --min-nodes: no message"; }

# 3. Every node answers: the failure is the program's, not restarted.
status=0
"$elastic" --hosts localhost --mpirun-args "$mpirun_args" -- /bin/sh -c 'exit 1' \
  --run-dir failing > failing.out 2>&1 || status=$?
[ "$status" = 1 ] || { cat failing.out; fail "a failing program: exit $status, want 1"; }
grep -q "every node answers: the run failed for its own reasons (exit 1); not restarted" \
  failing.out || { cat failing.out; fail "a failing program: no message"; }
[ "$(attempts failing)" = "failed, every node answers: not restarted" ] ||
  fail "a failing program: attempts $(attempts failing)"

# 4. hpc_train's usage error (2) is passed on at once.
status=0
"$elastic" --hosts localhost --mpirun-args "$mpirun_args" -- "$HPC_TRAIN" "${training[@]}" \
  --lr -1 --run-dir usage > usage.out 2>&1 || status=$?
[ "$status" = 2 ] || { cat usage.out; fail "hpc_train's usage error: exit $status, want 2"; }
grep -q "not restarted" usage.out || { cat usage.out; fail "hpc_train's usage error: restarted"; }

# 5. The supervisor's own usage.
expect_failure 2 "give hpc_train a --run-dir" "$elastic" --hosts localhost -- "$HPC_TRAIN"
expect_failure 2 "'x' is not a whole number" "$elastic" --min-nodes x --hosts a -- p --run-dir d
expect_failure 2 "no program after --" "$elastic" --hosts localhost --
expect_failure 2 "not inside a Slurm allocation" env -u SLURM_JOB_NODELIST "$elastic" -- p --run-dir d
echo "hpc_train_elastic: restarts after a lost node, and only then"

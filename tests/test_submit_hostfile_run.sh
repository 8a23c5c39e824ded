#!/usr/bin/env bash
# hpc_train_submit --hostfile, for real: a DeepSpeed hostfile naming this machine with 3 slots,
# mpirun and the real hpc_train train a 600-sample slice of Fashion-MNIST for one epoch at 3
# ranks. --oversubscribe reaches mpirun through --mpirun-args (2 cores here).
set -euo pipefail
# shellcheck source=tests/support/script_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"

submit=${HPC_TRAIN_SUBMIT:?}
source_dir=${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
[ -f "$source_dir/train-images-idx3-ubyte.gz" ] ||
  fail "Fashion-MNIST is missing: apt-get install dataset-fashion-mnist"
"$HPC_TRAIN_DATA" convert fashion-mnist "$source_dir" slice.h5 --max-train 600 --max-test 200
# Only the launcher's option may allow the oversubscription.
unset OMPI_MCA_rmaps_base_oversubscribe HPC_TRAIN_MPIRUN_ARGS
export HPC_TRAIN

printf '# this machine, 3 ranks\nlocalhost slots=3\n' > hostfile
rc=0
timeout 240 "$submit" --hostfile hostfile --mpirun-args --oversubscribe -- --dataset slice.h5 \
  --epochs 1 --micro-batch 16 --log-every 10 --run-dir run > train.out 2> train.err || rc=$?
cat train.err
cat train.out
[ "$rc" -eq 0 ] || fail "hpc_train_submit --hostfile exited with $rc"
expected="+ mpirun -np 3 -H localhost:3 --map-by ppr:3:node --oversubscribe $HPC_TRAIN --dataset slice.h5 --epochs 1 --micro-batch 16 --log-every 10 --run-dir run"
[ "$(head -n 1 train.err)" = "$expected" ] || fail "the command line shown is not '$expected'"
grep -q '^hpc_train 0.1.0: 3 rank(s)' train.out || fail "not 3 ranks"
grep -qE '^Epoch \[1/1\] done in [0-9.]+ s: train loss [0-9.]+, test loss [0-9.]+, test accuracy' \
  train.out || fail "no epoch line"
python3 - run/summary.json <<'PY'
import json, sys
summary = json.load(open(sys.argv[1]))
print("summary:", {k: summary.get(k) for k in ("world_size", "epochs_completed", "steps", "test_accuracy")})
assert summary["world_size"] == 3, summary
assert summary["epochs_completed"] == 1 and summary["steps"] == 13, summary
assert summary["test_samples"] == 200, summary
assert 0 < summary["test_accuracy"] <= 1, summary
PY
echo "hpc_train_submit --hostfile run passed"

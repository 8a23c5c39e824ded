#!/usr/bin/env bash
# Note [Ending the job]: one rank that fails while the trainer starts (Note [Test hooks]: rank 1
# alone, while ranks 0 and 2 go on into the broadcast of the weights, or past it) prints
# `[rank 1@host] error: ...` at once and the job ends within seconds (start-up included; 45 s
# bounds it on a loaded machine), with no watchdog to end it (--comm-timeout 0; before, the
# first two hung until the test's 60 s timeout): a missing --init-weights file, an allocation
# failure, a failing upload of the resident splits. And a fault switch that names no fault is
# refused.
set -euo pipefail
work="$HPC_TRAIN_TEST_WORK"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$HPC_TRAIN_DATA" convert fashion-mnist "${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" \
  small.h5 --max-train 240 --max-test 60 > /dev/null
common=(--dataset small.h5 --epochs 1 --micro-batch 8 --comm-timeout 0 --threads-per-rank 1)
timeout 120 "$MPIEXEC" -np 1 "$HPC_TRAIN" "${common[@]}" --max-steps 1 --run-dir init \
  --export-weights init.safetensors > init.out 2>&1 || { cat init.out; exit 1; }
failures=0

# expect_fault NAME FAULT TEXT -- hpc_train options...
expect_fault() {
  local name=$1 fault=$2 text=$3
  shift 4
  local start rc elapsed
  start=$(date +%s.%N)
  set +e
  HPC_TRAIN_TEST_FAULT=$fault timeout 60 "$MPIEXEC" -np 3 --oversubscribe \
    -x HPC_TRAIN_TEST_FAULT "$HPC_TRAIN" "${common[@]}" --run-dir "run-$name" "$@" \
    > "$name.out" 2> "$name.err"
  rc=$?
  set -e
  elapsed=$(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')")
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || ! python3 -c "import sys; sys.exit($elapsed > 45)" ||
     ! grep -qE "^\[rank 1@[^]]+\] error: .*$text" "$name.err"; then
    echo "FAIL $name: exit $rc in ${elapsed}s (want non-zero within 45 s, rank 1 naming '$text'), stderr:"
    cat "$name.err"
    failures=$((failures + 1))
  else
    echo "ok   $name: exit $rc in ${elapsed}s: $(grep -E "^\[rank 1@" "$name.err" | head -n 1)"
  fi
}

expect_fault init-weights init-weights@1 "init.safetensors.missing-on-this-rank" -- \
  --init-weights init.safetensors
expect_fault alloc alloc@1 "LibTorch: .*(alloc|memory)" --
expect_fault resident-upload resident-upload@1 "the upload of the resident train split failed" -- \
  --resident-data on

set +e
HPC_TRAIN_TEST_FAULT=allocate@1 timeout 60 "$MPIEXEC" -np 1 -x HPC_TRAIN_TEST_FAULT "$HPC_TRAIN" \
  "${common[@]}" --run-dir run-typo > typo.out 2> typo.err
rc=$?
set -e
if [ "$rc" -eq 0 ] || ! grep -qF "HPC_TRAIN_TEST_FAULT=allocate@1: expected KIND@RANK" typo.err; then
  echo "FAIL typo: exit $rc, stderr:"; cat typo.err; failures=$((failures + 1))
else
  echo "ok   typo: exit $rc"
fi
[ "$failures" -eq 0 ]

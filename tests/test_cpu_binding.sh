#!/usr/bin/env bash
# Note [Open MPI's default core binding] in hpc_train itself: a plain `mpirun -np 1` (which binds
# the rank to one core) runs on every CPU this test may use, says so, and counts its intra-op
# threads from them; `mpirun --bind-to core`, a binding chosen, is kept.
set -euo pipefail
hpc_train=${HPC_TRAIN:?set HPC_TRAIN to the hpc_train executable}
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"

# The CPUs this test may use (nproc alone would answer OMP_NUM_THREADS, which CTest sets to 1).
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
(( cpus >= 2 )) || skip "one CPU: nothing to widen"
fashion_mnist=${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
"${HPC_TRAIN_DATA:?}" convert fashion-mnist "$fashion_mnist" slice.h5 --max-train 256 --max-test 64
# run NAME [mpirun options]: a two-step run; its output in NAME.out.
run() {
  local name=$1
  shift
  timeout 120 "${MPIEXEC:?}" -np 1 "$@" "$hpc_train" --dataset slice.h5 --max-steps 2 --epochs 1 \
    --run-dir "$name" > "$name.out" 2>&1 || { cat "$name.out"; fail "$name: the run failed"; }
}

run default
grep -F "CPU binding: Open MPI's mpirun bound each rank to 1 CPU(s) by default; hpc_train's ranks run on the $cpus CPUs" default.out ||
  fail "no widening said: $(head -n 3 default.out)"
grep -qF "; $cpus CPU thread(s) per rank" default.out ||
  fail "intra-op threads not counted from $cpus CPUs: $(head -n 1 default.out)"

run chosen --bind-to core
! grep -F "CPU binding" chosen.out || fail "a chosen binding was undone"
grep -qF "; 1 CPU thread(s) per rank" chosen.out ||
  fail "bound to one core, yet: $(head -n 1 chosen.out)"
echo "cpu binding passed"

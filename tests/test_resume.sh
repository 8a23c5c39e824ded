#!/usr/bin/env bash
# Checkpoints and resume, with the real binary on 3 CPU ranks (ZeRO stage 2, so the optimizer
# state is partitioned and must be re-partitioned on resume):
#   1. a run that writes checkpoints ends bitwise equal to one that writes none;
#   2. k steps + resume from that checkpoint + the rest ends bitwise equal (--resume FILE);
#   3. SIGUSR1 to mpirun at an arbitrary step: checkpoint, exit 75; --resume auto continues and
#      ends bitwise equal;
#   4. world sizes 3 -> 2 -> 1 -> 3 at the same global batch (12 = 3 x 4 = 2 x 6 = 1 x 12)
#      ends within 1e-6 of the uninterrupted run (relative difference of the whole parameter
#      vector: the sums over ranks round differently at each world size).
# The final weights are compared through --export-weights with an independent safetensors
# reader (tests/support/check_safetensors.py), bytes for "bitwise".
set -euo pipefail
work="$HPC_TRAIN_TEST_WORK"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
check=$HPC_TRAIN_SOURCE_DIR/tests/support/check_safetensors.py
"$HPC_TRAIN_DATA" convert fashion-mnist "${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" \
  slice.h5 --max-train 240 --max-test 60 > /dev/null

# 240 samples / global batch 12 = 20 steps per epoch; 2 epochs = 40 steps.
common=(--dataset slice.h5 --epochs 2 --zero-stage 2 --lr 0.002 --progress lines)
# train NP MICRO_BATCH RUN_DIR [options...]: one run, its output in RUN_DIR.out.
train() {
  local np=$1 micro_batch=$2 run_dir=$3
  shift 3
  timeout 300 "$MPIEXEC" -np "$np" --oversubscribe "$HPC_TRAIN" "${common[@]}" \
    --micro-batch "$micro_batch" --run-dir "$run_dir" --log-every 5 "$@" > "$run_dir.out" 2>&1 ||
    { echo "run $run_dir failed:"; cat "$run_dir.out"; return 1; }
}
same() {  # same A B [rtol]: the weights in the two files agree (bytes, or ||A - B|| / ||B|| <= rtol)
  python3 "$check" "$1" --compare "$2" --quiet ${3:+--rtol "$3"} || { echo "FAIL: $1 vs $2"; exit 1; }
}

train 3 4 straight --checkpoint-epochs off --export-weights straight.safetensors
[ ! -d straight/checkpoints ] || { echo "FAIL: checkpoints written with --checkpoint-epochs off"; exit 1; }

echo "== 1. checkpoints do not change the run"
train 3 4 with-checkpoints --checkpoint-every 7 --keep-checkpoints 0 --export-weights with-checkpoints.safetensors
ls with-checkpoints/checkpoints
for step in 7 14 20 21 28 35 40; do
  [ -f "with-checkpoints/checkpoints/step-$(printf %08d $step).h5" ] || { echo "FAIL: no checkpoint of step $step"; exit 1; }
done
same with-checkpoints.safetensors straight.safetensors

echo "== 2. resume from step 7 (mid-epoch) and from step 20 (an epoch end)"
for step in 7 20; do
  file=with-checkpoints/checkpoints/step-$(printf %08d $step).h5
  train 3 4 "resumed-$step" --resume "$file" --export-weights "resumed-$step.safetensors"
  grep -q "Resumed from $file: step $step" "resumed-$step.out"
  same "resumed-$step.safetensors" straight.safetensors
done

echo "== 3. SIGUSR1 to mpirun, exit 75, --resume auto"
# mpirun itself in the background (not under `timeout`, which would take the signal): it
# forwards SIGUSR1 to every rank.
"$MPIEXEC" -np 3 --oversubscribe "$HPC_TRAIN" "${common[@]}" --micro-batch 4 \
  --run-dir signalled --log-every 1 --export-weights signalled.safetensors > signalled-1.out 2>&1 &
mpirun_pid=$!
deadline=$((SECONDS + 120))
until grep -q '"step":9,' signalled/metrics.jsonl 2>/dev/null; do
  if [ $SECONDS -ge $deadline ] || ! kill -0 "$mpirun_pid" 2>/dev/null; then
    echo "FAIL: the run ended or reached no step 9 within 120 s"; cat signalled-1.out; exit 1
  fi
  sleep 0.1
done
kill -USR1 "$mpirun_pid"
rc=0
wait "$mpirun_pid" || rc=$?
cat signalled-1.out | grep -E "Checkpoint|Stopped" || true
[ "$rc" -eq 75 ] || { echo "FAIL: exit $rc after SIGUSR1, want 75"; cat signalled-1.out; exit 1; }
grep -q "Stopped by SIGUSR1 after step" signalled-1.out
[ ! -f signalled.safetensors ] || { echo "FAIL: weights exported by a stopped run"; exit 1; }
train 3 4 signalled --resume auto --export-weights signalled.safetensors
grep -q "Resumed from" signalled.out
same signalled.safetensors straight.safetensors

echo "== 4. world sizes 3 -> 2 -> 1 -> 3"
train 2 6 resized --resume with-checkpoints/checkpoints/step-00000007.h5 --checkpoint-every 7 --max-steps 14
grep -q "saved by 3 rank(s), continuing on 2" resized.out
train 1 12 resized --resume auto --checkpoint-every 7 --max-steps 28
grep -q "Resumed from .*step-00000014.h5" resized.out
train 3 4 resized --resume auto --export-weights resized.safetensors
grep -q "Resumed from .*step-00000028.h5" resized.out
same resized.safetensors straight.safetensors 1e-6
echo "resume passed"

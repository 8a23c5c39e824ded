#!/usr/bin/env bash
# --checkpoint-every-minutes (Note [Checkpoint clock] in include/hpc_train/train/checkpoint_cadence.h)
# with the real binary on 3 CPU ranks (ZeRO stage 2, 20 steps an epoch, 2 epochs):
#   1. a short interval (0.001 min = 60 ms, about a step here, so that the ranks' own clocks
#      would differ at some steps) writes checkpoints between the epoch ends, at the steps
#      rank 0's clock chose: their records name the rule ("every 0.001 min"), there is
#      one complete file per checkpointed step (hpc_train_data export reads each and checks its
#      CRCs) and no temporary file, and the run ends bitwise equal to one without checkpoints:
#      every rank took part in every save at the same step (a rank that went on alone would
#      have hung in the next collective). A resume from a mid-epoch one ends bitwise equal too.
#   2. an interval longer than the run writes the epoch ends' checkpoints only.
#   3. a negative or NaN interval stops the job before training (exit 2, the option named; no
#      run directory), on the command line and in an INI file.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"
check=$HPC_TRAIN_SOURCE_DIR/tests/support/check_safetensors.py
"$HPC_TRAIN_DATA" convert fashion-mnist "${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" \
  slice.h5 --max-train 240 --max-test 60 > /dev/null

# 240 samples / global batch 12 = 20 steps per epoch; 2 epochs = 40 steps.
common=(--dataset slice.h5 --epochs 2 --micro-batch 4 --zero-stage 2 --lr 0.002 --progress lines
        --log-every 5 --keep-checkpoints 0)
# train RUN_DIR [options...]: one 3-rank run, its output in RUN_DIR.out.
train() {
  local run_dir=$1
  shift
  timeout 300 "$MPIEXEC" -np 3 --oversubscribe "$HPC_TRAIN" "${common[@]}" --run-dir "$run_dir" \
    "$@" > "$run_dir.out" 2>&1 || { cat "$run_dir.out"; fail "run $run_dir failed"; }
}
same() {  # same A B: the weights in the two files are the same bytes
  python3 "$check" "$1" --compare "$2" --quiet || fail "$1 differs from $2"
}
# checkpoint_steps RUN_DIR: "step why" of each checkpoint record, in order.
checkpoint_steps() {
  python3 -c '
import json, sys
for line in open(sys.argv[1] + "/metrics.jsonl"):
    r = json.loads(line)
    if r["kind"] == "checkpoint":
        print(r["step"], r["why"])' "$1"
}

train straight --checkpoint-epochs off --export-weights straight.safetensors

echo "== 1. every 0.001 min"
train timed --checkpoint-every-minutes 0.001 --export-weights timed.safetensors
checkpoint_steps timed | tee timed.steps
timed_steps=$(awk '$2 == "every" { print $1 }' timed.steps)
[ "$(grep -c "every 0.001 min" timed.steps)" -ge 2 ] || fail "fewer than 2 timed checkpoints"
[ "$(grep -v -c -e "every 0.001 min" -e "epoch end" timed.steps)" -eq 0 ] || fail "a checkpoint of another rule"
grep -q "^20 epoch end$" timed.steps && grep -q "^40 epoch end$" timed.steps || fail "an epoch end's checkpoint is missing"
grep -q "Checkpoint (every 0.001 min) after step" timed.out || fail "no log line names the rule"
# One file per checkpointed step, each complete, and `latest` (Note [Checkpoint branches]);
# nothing else.
expected_files=$( (echo latest; awk '{ printf "step-%08d.h5\n", $1 }' timed.steps) | sort -u)
[ "$(ls -A timed/checkpoints)" = "$expected_files" ] ||
  fail "checkpoint files $(ls -A timed/checkpoints | tr '\n' ' ') != $(echo $expected_files)"
mkdir exports
for file in timed/checkpoints/*.h5; do
  "$HPC_TRAIN_DATA" export "$file" "exports/$(basename "$file" .h5).safetensors" > /dev/null ||
    fail "$file does not read back"
done
same timed.safetensors straight.safetensors
# A mid-epoch one (not an epoch end's step) resumes to the same end.
mid=$(echo "$timed_steps" | awk '$1 % 20 != 0' | head -n 1)
[ -n "$mid" ] || fail "no timed checkpoint inside an epoch"
file=timed/checkpoints/step-$(printf %08d "$mid").h5
train resumed --resume "$file" --checkpoint-epochs off --export-weights resumed.safetensors
grep -q "Resumed from $file: step $mid" resumed.out || fail "no resume from $file"
same resumed.safetensors straight.safetensors

echo "== 2. every 60 min: the epoch ends only"
train hourly --checkpoint-every-minutes 60
checkpoint_steps hourly | tee hourly.steps
[ "$(cat hourly.steps)" = $'20 epoch end\n40 epoch end' ] || fail "hourly: $(cat hourly.steps)"
[ "$(ls -A hourly/checkpoints | tr '\n' ' ')" = "latest step-00000020.h5 step-00000040.h5 " ] ||
  fail "hourly: files $(ls -A hourly/checkpoints)"

echo "== 3. refused before training"
for bad in -1 nan; do
  expect_failure 2 "--checkpoint-every-minutes $bad: must be 0 (off) or a finite number of minutes" \
    timeout 60 "$MPIEXEC" -np 3 --oversubscribe "$HPC_TRAIN" "${common[@]}" --run-dir "bad$bad" \
    "--checkpoint-every-minutes=$bad"
  [ ! -e "bad$bad" ] || fail "--checkpoint-every-minutes $bad: the run directory was made"
done
printf '[checkpoint]\ncheckpoint_every_minutes = -0.5\n' > bad.ini
expect_failure 2 "--checkpoint-every-minutes -0.5: must be 0 (off)" \
  timeout 60 "$MPIEXEC" -np 3 --oversubscribe "$HPC_TRAIN" "${common[@]}" --run-dir bad-ini \
  --config bad.ini
[ ! -e bad-ini ] || fail "the INI file's value: the run directory was made"
echo "checkpoint minutes passed"

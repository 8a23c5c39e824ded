#!/usr/bin/env bash
# Note [Checkpoint branches] (checkpoint_files.h): --resume auto follows the branch the user
# chose. 3 CPU ranks, a checkpoint every 2 steps, the newest 3 kept:
#   1. a run to step 10 keeps steps 6, 8, 10, and `latest` names step 10;
#   2. resumed by hand from step 6 to step 8: the abandoned 8 and 10 are moved (not deleted)
#      into checkpoints/abandoned-after-step-6-*, the new step 8 is written, `latest` names it;
#   3. --resume auto (as after a preemption) continues from the new step 8, not the abandoned 10,
#      and ends bitwise equal to a run resumed from step 6 straight to the same step.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"
"$HPC_TRAIN_DATA" convert fashion-mnist "${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" \
  slice.h5 --max-train 240 --max-test 60 > /dev/null
common=(--dataset slice.h5 --epochs 2 --micro-batch 4 --zero-stage 2 --lr 0.002 --progress lines
        --checkpoint-epochs off --checkpoint-every 2 --keep-checkpoints 3)
# train NAME [options...]: 3 ranks, the output in NAME.out.
train() {
  local name=$1
  shift
  timeout 300 "$MPIEXEC" -np 3 --oversubscribe "$HPC_TRAIN" "${common[@]}" "$@" > "$name.out" 2>&1 ||
    { cat "$name.out"; fail "run $name failed"; }
}
step_file() { printf 'step-%08d.h5' "$1"; }
listing() { (cd "$1" && ls -1 | tr '\n' ' '); }

train first --run-dir run --max-steps 10
[ "$(listing run/checkpoints)" = "latest $(step_file 6) $(step_file 8) $(step_file 10) " ] ||
  fail "after the first run: $(listing run/checkpoints)"
[ "$(cat run/checkpoints/latest)" = "$(step_file 10)" ] || fail "latest: $(cat run/checkpoints/latest)"
cp run/checkpoints/"$(step_file 10)" abandoned-10.h5
cp run/checkpoints/"$(step_file 6)" step-6.h5  # pruned later; the straight run starts from it

train by-hand --run-dir run --resume "run/checkpoints/$(step_file 6)" --max-steps 8
grep -q "Checkpoints after step 6, of the run this one abandons, moved to run/checkpoints/abandoned-after-step-6-" \
  by-hand.out || { cat by-hand.out; fail "no line about the abandoned checkpoints"; }
aside=$(ls -d run/checkpoints/abandoned-after-step-6-*)
[ "$(listing "$aside")" = "$(step_file 8) $(step_file 10) " ] || fail "set aside: $(listing "$aside")"
cmp -s "$aside/$(step_file 10)" abandoned-10.h5 || fail "the abandoned step 10 changed"
[ "$(cat run/checkpoints/latest)" = "$(step_file 8)" ] || fail "latest: $(cat run/checkpoints/latest)"

train auto --run-dir run --resume auto --max-steps 12 --export-weights branch.safetensors
grep -q "^Resumed from run/checkpoints/$(step_file 8): step 8," auto.out ||
  { grep Resumed auto.out; fail "--resume auto did not continue the chosen branch's step 8"; }
train straight --run-dir straight --resume step-6.h5 --max-steps 12 \
  --export-weights straight.safetensors
python3 "$HPC_TRAIN_SOURCE_DIR/tests/support/check_safetensors.py" branch.safetensors \
  --compare straight.safetensors --quiet || fail "the branch's weights differ from 6 -> 12 straight"
echo "--resume auto followed the branch resumed by hand (6 -> 8 -> 12 == 6 -> 12); abandoned 8, 10 in $aside"

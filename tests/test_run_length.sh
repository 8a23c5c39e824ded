#!/usr/bin/env bash
# Note [Run length] in a real run (1 CPU rank, simple_cnn):
#   1. 416 samples, micro-batch 32 (13 micro-steps an epoch), --grad-accum 2, 4 epochs,
#      warmup-cosine: 26 updates, all of them planned by the schedule (none at lr 0), epoch-end
#      checkpoints at the first update at or after each epoch's end (7, 13, 20, 26);
#   2. the interval loss of an update that spans an epoch boundary is the mean of its two
#      micro-batches' losses (at a learning rate too small to change a weight, every micro-batch's
#      loss is known from a run without accumulation);
#   3. a resume from the checkpoint of step 7 (inside epoch 2, after a window that began in
#      epoch 1) ends bitwise equal to the uninterrupted run;
#   4. a final partial window is applied, averaged over its own micro-steps: 160 samples at
#      micro-batch 32 and --grad-accum 4 (updates of 4 and 1 micro-steps) end where micro-batch
#      128 without accumulation (batches of 128 and 32) ends.
set -euo pipefail
work="$HPC_TRAIN_TEST_WORK"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
check=$HPC_TRAIN_SOURCE_DIR/tests/support/check_safetensors.py
fashion=${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
"$HPC_TRAIN_DATA" convert fashion-mnist "$fashion" s416.h5 --max-train 416 --max-test 32 > /dev/null
"$HPC_TRAIN_DATA" convert fashion-mnist "$fashion" s160.h5 --max-train 160 --max-test 32 > /dev/null

# train RUN_DIR [options...]: one run on one rank, its output in RUN_DIR.out.
train() {
  local run_dir=$1
  shift
  timeout 240 "$MPIEXEC" -np 1 "$HPC_TRAIN" --progress lines --threads-per-rank 1 \
    --run-dir "$run_dir" "$@" > "$run_dir.out" 2>&1 ||
    { echo "run $run_dir failed:"; cat "$run_dir.out"; return 1; }
}
fail() { echo "FAIL: $*"; exit 1; }

echo "== 1. 4 epochs of 13 micro-steps at --grad-accum 2"
accumulated=(--dataset s416.h5 --micro-batch 32 --grad-accum 2 --epochs 4 --lr 0.002
             --lr-schedule warmup-cosine --warmup-steps 4 --warmup-start-ratio 0.1 --log-every 1
             --keep-checkpoints 0)
train accumulated "${accumulated[@]}" --export-weights accumulated.safetensors
grep -F "6-7 steps per epoch, 26 steps in all" accumulated.out ||
  fail "the start line does not announce 6-7 steps per epoch, 26 in all"
python3 - accumulated/metrics.jsonl <<'CHECK'
import json, sys
train = [r for r in map(json.loads, open(sys.argv[1])) if r.get("kind") == "train"]
steps = [r["step"] for r in train]
assert steps == list(range(1, 27)), f"steps logged: {steps}"
lrs = [r["lr"] for r in train]
assert all(lr > 0 for lr in lrs), f"an update at lr 0: {lrs}"
# After the warm-up the cosine decreases to its end, which the run's last update reaches.
assert all(a > b for a, b in zip(lrs[4:], lrs[5:])), f"lr not decreasing after warm-up: {lrs}"
per_epoch = {}
for r in train:
    per_epoch.setdefault(r["epoch"], []).append(r["step_in_epoch"])
assert per_epoch == {1: list(range(1, 7)), 2: list(range(1, 8)), 3: list(range(1, 7)),
                     4: list(range(1, 8))}, f"steps in epochs: {per_epoch}"
print("26 updates, lr", lrs[0], "...", lrs[-1], "; steps per epoch 6, 7, 6, 7")
CHECK
checkpoints=$(cd accumulated/checkpoints && ls step-*.h5 | tr '\n' ' ')
[ "$checkpoints" = "step-00000007.h5 step-00000013.h5 step-00000020.h5 step-00000026.h5 " ] ||
  fail "epoch-end checkpoints: $checkpoints"
grep -F "Checkpoint (epoch end) after step 7:" accumulated.out > /dev/null ||
  { grep -i checkpoint accumulated.out; fail "no epoch-end checkpoint reported at step 7"; }

echo "== 2. the loss of an update across an epoch boundary"
still=(--dataset s416.h5 --micro-batch 32 --epochs 2 --lr 1e-30 --log-every 1
       --checkpoint-epochs off)
train per-micro-batch "${still[@]}"
train per-update "${still[@]}" --grad-accum 2
python3 - per-micro-batch/metrics.jsonl per-update/metrics.jsonl <<'CHECK'
import json, sys
def losses(path):
    return [r["loss"] for r in map(json.loads, open(path)) if r.get("kind") == "train"]
single, paired = losses(sys.argv[1]), losses(sys.argv[2])
assert len(single) == 26 and len(paired) == 13, (len(single), len(paired))
worst = max(abs(p - (single[2 * i] + single[2 * i + 1]) / 2) / abs(p)
            for i, p in enumerate(paired))
# Update 7 holds micro-batch 13 of epoch 1 and micro-batch 1 of epoch 2.
print(f"update 7: {paired[6]:.6f}, micro-batches 13 and 14: {single[12]:.6f}, {single[13]:.6f}; "
      f"worst relative difference over the 13 updates {worst:.2e}")
assert worst < 1e-5, worst
CHECK

echo "== 3. resume from step 7"
train resumed "${accumulated[@]}" --resume accumulated/checkpoints/step-00000007.h5 \
  --export-weights resumed.safetensors
python3 "$check" resumed.safetensors --compare accumulated.safetensors --quiet ||
  fail "resumed from step 7 is not bitwise equal to the uninterrupted run"

echo "== 4. a final partial window"
train window-4-of-32 --dataset s160.h5 --micro-batch 32 --grad-accum 4 --epochs 1 --lr 0.002 \
  --checkpoint-epochs off --export-weights window-4-of-32.safetensors
grep -F "1-2 steps per epoch, 2 steps in all" window-4-of-32.out ||
  fail "the start line does not announce 2 steps"
train batch-128 --dataset s160.h5 --micro-batch 128 --epochs 1 --lr 0.002 \
  --checkpoint-epochs off --export-weights batch-128.safetensors
python3 "$check" window-4-of-32.safetensors --compare batch-128.safetensors --rtol 1e-5 ||
  fail "the final partial window does not train as one batch of its samples"
echo "PASS"

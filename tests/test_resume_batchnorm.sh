#!/usr/bin/env bash
# BatchNorm statistics in checkpoints (Note [Resume position] in checkpoint.h, RunCheckpoints::save):
# resnet18 on 3 CPU ranks, whose running means and variances differ per rank (each rank updates
# them from its own batches), checkpoints mid-epoch with the collective (parallel HDF5) write.
# The buffers are made rank 0's before every checkpoint, so the file reads back (every dataset's
# crc32 matches whichever rank's bytes landed) and the resumed run ends bitwise equal to the
# uninterrupted one that wrote the checkpoint.
set -euo pipefail
work="$HPC_TRAIN_TEST_WORK"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
check=$HPC_TRAIN_SOURCE_DIR/tests/support/check_safetensors.py
"$HPC_TRAIN_DATA" convert fashion-mnist "${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" \
  slice.h5 --max-train 120 --max-test 30 > /dev/null

# 120 samples / global batch 12 = 10 steps; a checkpoint after step 4 (mid-epoch).
common=(--dataset slice.h5 --model resnet18 --epochs 1 --micro-batch 4 --zero-stage 2
        --checkpoint-epochs off --progress lines --log-every 5)
train() {  # train RUN_DIR [options...]
  local run_dir=$1
  shift
  timeout 400 "$MPIEXEC" -np 3 --oversubscribe "$HPC_TRAIN" "${common[@]}" --run-dir "$run_dir" \
    "$@" > "$run_dir.out" 2>&1 || { echo "run $run_dir failed:"; cat "$run_dir.out"; return 1; }
}

train straight --checkpoint-every 4 --export-weights straight.safetensors
file=straight/checkpoints/step-00000004.h5
[ -f "$file" ] || { echo "FAIL: no checkpoint of step 4"; ls straight/checkpoints; exit 1; }
train resumed --resume "$file" --export-weights resumed.safetensors
grep -q "Resumed from $file: step 4" resumed.out
python3 "$check" resumed.safetensors --compare straight.safetensors --quiet ||
  { echo "FAIL: the resumed resnet18 differs from the uninterrupted one"; exit 1; }
echo "batchnorm resume passed"

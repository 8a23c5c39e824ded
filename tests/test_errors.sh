#!/usr/bin/env bash
# Bad input ends every rank with a non-zero exit within 30 s and a message naming the problem:
# a missing dataset, corrupt and truncated files, invalid option values, and a label out of
# range that only one rank meets in the middle of training.
set -euo pipefail
work="$HPC_TRAIN_TEST_WORK"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0

# expect_failure NAME EXIT_CODE TEXT -- hpc_train options...
expect_failure() {
  local name=$1 expected_rc=$2 text=$3
  shift 4
  local start rc elapsed
  start=$(date +%s)
  set +e
  timeout 60 "$MPIEXEC" -np 3 --oversubscribe "$HPC_TRAIN" --run-dir "$work/run-$name" "$@" \
    > "$name.out" 2> "$name.err"
  rc=$?
  set -e
  elapsed=$(( $(date +%s) - start ))
  if [ "$rc" -ne "$expected_rc" ] || [ "$elapsed" -gt 30 ] || ! grep -qF -- "$text" "$name.err"; then
    echo "FAIL $name: exit $rc (want $expected_rc), ${elapsed}s (want <= 30), stderr:"
    cat "$name.err"
    failures=$((failures + 1))
  else
    echo "ok   $name: exit $rc in ${elapsed}s: $(grep -F -- "$text" "$name.err" | head -n 1)"
  fi
}

expect_failure missing-dataset 3 "$work/nowhere.h5" -- --dataset "$work/nowhere.h5"

head -c 4096 /dev/urandom > garbage.h5
expect_failure garbage-file 3 "garbage.h5" -- --dataset garbage.h5

"$HPC_TRAIN_DATA" convert fashion-mnist "${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" small.h5 \
  --max-train 600 --max-test 100 > /dev/null
head -c "$(( $(stat -c %s small.h5) / 2 ))" small.h5 > truncated.h5
expect_failure truncated-file 3 "truncated.h5" -- --dataset truncated.h5

expect_failure zero-micro-batch 2 "--micro-batch" -- --dataset small.h5 --micro-batch 0
expect_failure malformed-number 2 "epochs" -- --dataset small.h5 --epochs ten
expect_failure unknown-option 2 "--bogus" -- --dataset small.h5 --bogus 1
expect_failure unknown-model 2 "resnet18" -- --dataset small.h5 --model vgg99
# Placement is agreed by all ranks (placement.h): with no GPU anywhere, --device cuda names them.
if ! nvidia-smi -L > /dev/null 2>&1; then
  expect_failure device-cuda-without-gpu 2 \
    "--device cuda: ranks 0-2 (node $(hostname)) see no GPU" -- --dataset small.h5 --device cuda
fi

# One rank meets the bad label while the others train on: the job must still end, naming it.
cp small.h5 bad-label.h5
"$CORRUPT_LABEL" bad-label.h5 train 321 42
expect_failure bad-label 3 "= 42" -- --dataset bad-label.h5 --epochs 1 --micro-batch 16

# Checkpoints that cannot be resumed from: missing, not HDF5, not a checkpoint (the dataset
# file), truncated, another model's, one whose data was altered.
expect_failure resume-missing 3 "$work/nowhere-ckpt.h5" -- --dataset small.h5 --resume "$work/nowhere-ckpt.h5"
expect_failure resume-garbage 3 "garbage.h5" -- --dataset small.h5 --resume garbage.h5
expect_failure resume-dataset-file 3 "small.h5" -- --dataset small.h5 --resume small.h5
"$MPIEXEC" -np 1 "$HPC_TRAIN" --dataset small.h5 --model resnet18 --micro-batch 2 --max-steps 1 \
  --run-dir resnet > resnet.out 2>&1 || { cat resnet.out; exit 1; }
"$MPIEXEC" -np 1 "$HPC_TRAIN" --dataset small.h5 --micro-batch 8 --max-steps 2 \
  --run-dir cnn > cnn.out 2>&1 || { cat cnn.out; exit 1; }
expect_failure resume-other-model 3 "resnet18" -- --dataset small.h5 --resume resnet/checkpoints/step-00000001.h5
cnn_checkpoint=cnn/checkpoints/step-00000002.h5
head -c "$(( $(stat -c %s "$cnn_checkpoint") * 2 / 3 ))" "$cnn_checkpoint" > truncated-ckpt.h5
expect_failure resume-truncated 3 "truncated-ckpt.h5" -- --dataset small.h5 --resume truncated-ckpt.h5
# A flipped byte in the middle of the data (the optimizer arrays): the checksum catches it.
cp "$cnn_checkpoint" flipped-ckpt.h5
python3 - flipped-ckpt.h5 <<'PY'
import sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
middle = len(data) // 2
data[middle] ^= 0x40
open(path, "wb").write(data)
PY
expect_failure resume-flipped-byte 3 "flipped-ckpt.h5" -- --dataset small.h5 --resume flipped-ckpt.h5

[ "$failures" -eq 0 ] && echo "all error cases passed" || { echo "$failures error case(s) failed"; exit 1; }

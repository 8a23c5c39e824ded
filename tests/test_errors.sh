#!/usr/bin/env bash
# Bad input ends every rank with a non-zero exit within 30 s and a message naming the problem:
# a missing dataset, corrupt and truncated files, invalid option values and bounds, labels out of
# range anywhere in either split, mean/std attributes that would make the inputs inf or NaN,
# samples too large for the node, a micro-batch larger than a rank's share of the data, and a
# DeepSpeed batch that overflows. What the dataset or the options make impossible is refused
# before training starts; a chunk of images that cannot be read, which only reading it shows,
# ends the job from the rank that meets it in the middle of training, and so does a checkpoint
# file that cannot be written.
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

# expect_refusal NAME EXIT_CODE TEXT -- hpc_train options...: expect_failure, and no step ran
# (rank 0 prints "Training ..." when training starts).
expect_refusal() {
  local name=$1
  expect_failure "$@"
  if grep -q "^Training " "$name.out"; then
    echo "FAIL $name: refused only after training had started:"
    cat "$name.out"
    failures=$((failures + 1))
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

# One rank meets an unreadable chunk of images while the others train on: the job must still end,
# naming the file.
cp small.h5 damaged.h5
"$EDIT_DATASET" damage-image damaged.h5 train 321
expect_failure damaged-chunk 3 "damaged.h5: reading /train" -- --dataset damaged.h5 --epochs 1 --micro-batch 16

# A checkpoint whose file cannot be written ends the job naming the file, though rank 0 writes it
# on a thread of its own while the training goes on (Note [Background checkpoint writes]): a
# directory holds the name of step 5's file, so its rename fails; every rank learns it when the
# next checkpoint (step 10) waits for the write, and that checkpoint is not taken.
blocked_dir="$work/run-checkpoint-blocked/checkpoints"
mkdir -p "$blocked_dir/step-00000005.h5/occupied"
expect_failure checkpoint-blocked 1 "cannot write checkpoint $blocked_dir/step-00000005.h5" -- \
  --dataset small.h5 --epochs 3 --micro-batch 16 --checkpoint-every 5
if grep -q "after step 10" checkpoint-blocked.out || [ -e "$blocked_dir/step-00000010.h5" ] ||
   ls "$blocked_dir" | grep -q "tmp"; then
  echo "FAIL checkpoint-blocked: want no checkpoint at step 10 and no temporary file left;"
  echo "stdout, stderr and the directory:"
  cat checkpoint-blocked.out checkpoint-blocked.err; ls -l "$blocked_dir"
  failures=$((failures + 1))
fi

# Every label of both splits is checked when the file is opened: one that the first steps would
# read, one they would not (the last train sample), one of the test split.
cp small.h5 bad-label.h5
"$EDIT_DATASET" label bad-label.h5 train 321 42
expect_refusal bad-label 3 "bad-label.h5: /train/labels[321] = 42 is outside [0, 10)" -- \
  --dataset bad-label.h5 --epochs 1 --micro-batch 16
cp small.h5 unread-label.h5
"$EDIT_DATASET" label unread-label.h5 train 599 42
expect_refusal unread-label 3 "unread-label.h5: /train/labels[599] = 42 is outside [0, 10)" -- \
  --dataset unread-label.h5 --max-steps 2 --micro-batch 16
cp small.h5 test-label.h5
"$EDIT_DATASET" label test-label.h5 test 57 -3
expect_refusal test-label 3 "test-label.h5: /test/labels[57] = -3 is outside [0, 10)" -- \
  --dataset test-label.h5 --max-steps 2 --micro-batch 16

# Normalisation divides by std and subtracts mean: 0 or NaN would train on inf/NaN silently.
cp small.h5 std-zero.h5
"$EDIT_DATASET" floats std-zero.h5 std 0
expect_refusal std-zero 3 "std-zero.h5: attribute 'std'[0] = 0, expected a finite number > 0" -- \
  --dataset std-zero.h5 --max-steps 2 --micro-batch 16
cp small.h5 mean-nan.h5
"$EDIT_DATASET" floats mean-nan.h5 mean nan
expect_refusal mean-nan 3 "mean-nan.h5: attribute 'mean'[0] = nan, expected a finite number" -- \
  --dataset mean-nan.h5 --max-steps 2 --micro-batch 16
# Samples of 1x2^20x2^20 (1 TiB each; the file stores none of them): a micro-batch's input
# cannot fit in any node's memory.
cp small.h5 huge-sample.h5
"$EDIT_DATASET" image-shape huge-sample.h5 1 1048576 1048576
expect_refusal huge-sample 3 "huge-sample.h5: one sample of 1x1048576x1048576 (channels x height x width) is 1 TiB" -- \
  --dataset huge-sample.h5 --max-steps 2 --micro-batch 1

# 600 samples over 3 ranks are 200 a rank: a micro-batch of 201 would never be full.
expect_refusal micro-batch-share 2 "--micro-batch 201: more than each rank's share of the train split of small.h5 (600 samples): 3 ranks get 200 samples each" -- \
  --dataset small.h5 --max-steps 2 --micro-batch 201
"$HPC_TRAIN_DATA" convert fashion-mnist "${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" two.h5 \
  --max-train 2 --max-test 10 > /dev/null
expect_refusal drop-last-share 2 "--drop-last: the train split of two.h5 (2 samples) has fewer samples than the 3 ranks" -- \
  --dataset two.h5 --max-steps 2 --micro-batch 1 --drop-last

# Bounds of options: a minimum loss scale above the start, a bucket of no byte, more threads
# than the node has, a DeepSpeed batch whose product overflows 64 bits.
expect_refusal min-loss-scale 2 "--min-loss-scale 131072: must not exceed the dynamic loss scale's start, 2^16 = 65536" -- \
  --dataset small.h5 --max-steps 2 --micro-batch 16 --min-loss-scale 131072
expect_refusal bucket-mb 2 "--bucket-mb 1e-07: must be 0 (chosen by the ZeRO stage) or a number of MiB" -- \
  --dataset small.h5 --max-steps 2 --micro-batch 16 --bucket-mb 1e-7
# 100000 threads a rank stalled the start: nothing was printed in 120 s.
expect_refusal threads-per-rank 2 "--threads-per-rank 100000: more than the" -- \
  --dataset small.h5 --max-steps 2 --micro-batch 16 --threads-per-rank 100000
echo '{"train_micro_batch_size_per_gpu": 2147483647, "gradient_accumulation_steps": 2147483647}' \
  > ds-overflow.json
expect_refusal ds-batch-overflow 2 "train_micro_batch_size_per_gpu x gradient_accumulation_steps x world size = 2147483647 x 2147483647 x 3 ranks overflows a 64-bit integer" -- \
  --dataset small.h5 --max-steps 2 --deepspeed-config ds-overflow.json

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

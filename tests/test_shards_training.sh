#!/usr/bin/env bash
# Training on shards is training on the file they came from (data/dataset_shards.h), with the
# real binaries:
#   1. hpc_train_data shard cuts a Fashion-MNIST slice (250 train, 61 test) into 3 shards and an
#      index; inspect describes the set; bad shard counts end with exit 2, a bad input with 3;
#   2. at 1, 2 and 3 ranks, training on the file, on the shards through a quoted pattern and
#      through the index ends with the same weights (--export-weights, compared byte for byte
#      with cmp) and the same losses (every loss of metrics.jsonl, as printed there); the
#      pattern read from an INI file (the run directory's config.ini) too;
#   3. the same with the splits resident (--resident-data on: training and evaluation gather on
#      the device) and read by the loader (off);
#   4. a run over the shards checkpointed at step 7 and resumed (by the pattern, and on the file)
#      ends byte for byte where the uninterrupted run over the file ends;
#   5. a pattern that matches nothing, an index whose counts disagree with a shard, a missing
#      shard and shards of two layouts end every rank with exit 3 and a message naming them;
#   6. shard copies a block at a time: cutting 256 MiB into two shards raises its peak resident
#      memory less than 64 MiB over inspect's.
set -euo pipefail
work="$HPC_TRAIN_TEST_WORK"
rm -rf "$work" && mkdir -p "$work" && cd "$work"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

"$HPC_TRAIN_DATA" convert fashion-mnist "${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" \
  slice.h5 --max-train 250 --max-test 61 > /dev/null

echo "== 1. hpc_train_data shard and inspect"
mkdir parts
"$HPC_TRAIN_DATA" shard slice.h5 --shards 3 parts/slice | tee shard.out
for name in slice-00000-of-00003.h5 slice-00001-of-00003.h5 slice-00002-of-00003.h5 slice.shards; do
  grep -qxF "wrote parts/$name" shard.out || fail "shard did not report parts/$name"
done
[ "$(ls parts | wc -l)" -eq 4 ] || fail "parts/ holds more than the 3 shards and the index: $(ls parts)"
# 250 = 84 + 83 + 83 train, 61 = 21 + 20 + 20 test samples, in order.
grep -v '^#' parts/slice.shards > index-lines.txt
printf '%s\n' "hpc_train-shards 1" "slice-00000-of-00003.h5 84 21" "slice-00001-of-00003.h5 83 20" \
  "slice-00002-of-00003.h5 83 20" | diff - index-lines.txt || fail "the index differs"
for spec in parts/slice.shards 'parts/slice-*.h5'; do
  "$HPC_TRAIN_DATA" inspect "$spec" > inspect.out
  grep -qF "$spec (" inspect.out && grep -qF ": 3 shard(s)" inspect.out &&
    grep -qF "parts/slice-00001-of-00003.h5: 83 train, 20 test" inspect.out &&
    grep -qE "^  train: +250 samples" inspect.out && grep -qE "^  test: +61 samples" inspect.out ||
    { cat inspect.out; fail "inspect $spec"; }
  # The shards carry the file's statistics (Note [Shard layout]).
  diff <("$HPC_TRAIN_DATA" inspect slice.h5 | grep -E "^  (mean|std|shape|classes):") \
    <(grep -E "^  (mean|std|shape|classes):" inspect.out) || fail "inspect $spec: another layout"
done
# expect_failure CODE TEXT COMMAND...: COMMAND exits with CODE and its stderr contains TEXT.
expect_failure() {
  local code=$1 text=$2 status=0
  shift 2
  "$@" > failure.out 2> failure.err || status=$?
  [ "$status" -eq "$code" ] || fail "$* exited with $status, expected $code: $(cat failure.err)"
  grep -qF -- "$text" failure.err || fail "$*: stderr lacks '$text': $(cat failure.err)"
}
expect_failure 2 "--shards 0: must be at least 1" "$HPC_TRAIN_DATA" shard slice.h5 --shards 0 bad
expect_failure 2 "--shards 251: more than the 250 train samples of slice.h5" \
  "$HPC_TRAIN_DATA" shard slice.h5 --shards 251 bad
expect_failure 2 "shard needs --shards K" "$HPC_TRAIN_DATA" shard slice.h5 bad
expect_failure 2 "--shards belongs to shard" "$HPC_TRAIN_DATA" inspect slice.h5 --shards 2
expect_failure 3 "absent.h5: no such file" "$HPC_TRAIN_DATA" shard absent.h5 --shards 2 bad
expect_failure 3 "no such directory" "$HPC_TRAIN_DATA" shard slice.h5 --shards 2 nodir/bad
expect_failure 3 "the pattern 'parts/none-*.h5' matches no file" "$HPC_TRAIN_DATA" inspect 'parts/none-*.h5'
[ -z "$(ls | grep '^bad')" ] || fail "a refused shard command wrote files: $(ls | grep '^bad')"

# train NP NAME DATASET [options...]: one run, its output in NAME.out, its weights NAME.safetensors.
common=(--epochs 2 --micro-batch 5 --lr 0.002 --zero-stage 2 --progress lines --log-every 4
        --checkpoint-epochs off)
train() {
  local np=$1 name=$2 dataset=$3
  shift 3
  timeout 300 "$MPIEXEC" -np "$np" --oversubscribe "$HPC_TRAIN" "${common[@]}" --dataset "$dataset" \
    --run-dir "$name" --export-weights "$name.safetensors" "$@" > "$name.out" 2>&1 ||
    { cat "$name.out"; fail "run $name failed"; }
}
# same A B: bitwise equal weights and the same losses (every record's "loss" in metrics.jsonl).
same() {
  cmp "$1.safetensors" "$2.safetensors" || fail "$1 and $2 end with different weights"
  grep -o '"kind":"[a-z]*"\|"loss":[^,}]*' "$1/metrics.jsonl" > "$1.losses"
  grep -o '"kind":"[a-z]*"\|"loss":[^,}]*' "$2/metrics.jsonl" > "$2.losses"
  [ "$(grep -c '"loss"' "$1.losses")" -ge 8 ] || fail "$1: too few losses in metrics.jsonl"
  diff "$1.losses" "$2.losses" || fail "$1 and $2 report different losses"
  diff <(grep -o 'train loss .*' "$1.out") <(grep -o 'train loss .*' "$2.out") ||
    fail "$1 and $2 print different epoch lines"
  echo "same: $1 $2 ($(grep -c '"loss"' "$1.losses") losses, last $(grep '"loss"' "$1.losses" | tail -1))"
}

echo "== 2. the file, the pattern and the index at 1, 2 and 3 ranks"
for np in 1 2 3; do
  train "$np" "file-$np" slice.h5
  train "$np" "glob-$np" 'parts/slice-*.h5'
  train "$np" "index-$np" parts/slice.shards
  grep -qF "250 samples" "glob-$np.out" || fail "glob-$np: not 250 samples"
  same "glob-$np" "file-$np"
  same "index-$np" "file-$np"
done
# The pattern in an INI file: the run directory's config.ini (dataset = parts/slice-*.h5, no
# quotes) repeats the run.
grep -qxF "dataset = parts/slice-*.h5" glob-1/config.ini || fail "glob-1/config.ini: no pattern"
timeout 300 "$MPIEXEC" -np 1 "$HPC_TRAIN" --config glob-1/config.ini --run-dir ini-1 \
  --export-weights ini-1.safetensors > ini-1.out 2>&1 || { cat ini-1.out; fail "run ini-1 failed"; }
same ini-1 file-1
# The comparison can tell runs apart: another seed ends elsewhere.
train 1 seed-1 slice.h5 --seed 2
! cmp -s seed-1.safetensors file-1.safetensors || fail "another seed ended with the same weights"

echo "== 3. resident data on and off"
for resident in on off; do
  train 2 "file-resident-$resident" slice.h5 --resident-data "$resident"
  train 2 "index-resident-$resident" parts/slice.shards --resident-data "$resident"
  same "index-resident-$resident" "file-resident-$resident"
done
same file-resident-on file-2

echo "== 4. checkpoint over the shards, resume"
train 3 checkpointed parts/slice.shards --checkpoint-every 7 --keep-checkpoints 0
step7=checkpointed/checkpoints/step-00000007.h5
[ -f "$step7" ] || fail "no checkpoint of step 7"
train 3 resumed 'parts/slice-*.h5' --resume "$step7"
grep -qF "Resumed from $step7: step 7" resumed.out || fail "resumed: no resume line"
cmp resumed.safetensors file-3.safetensors || fail "resumed over the shards ends elsewhere"
cmp checkpointed.safetensors file-3.safetensors || fail "checkpointed run ends elsewhere"
# The shards are the file: their checkpoint resumes on it too (as a resume checks only that the
# data fits the checkpoint, any set of the same layout would; see docs/data.md, "Sharded datasets").
train 3 resumed-on-file slice.h5 --resume "$step7"
cmp resumed-on-file.safetensors file-3.safetensors || fail "resumed on the file ends elsewhere"

echo "== 5. wrong sets end every rank with exit 3"
# hpc_train_fails TEXT DATASET: a 2-rank run over DATASET exits 3 naming TEXT.
hpc_train_fails() {
  local text=$1 dataset=$2 status=0
  timeout 120 "$MPIEXEC" -np 2 --oversubscribe "$HPC_TRAIN" "${common[@]}" --dataset "$dataset" \
    --run-dir "failed" > failed.out 2>&1 || status=$?
  [ "$status" -eq 3 ] || { cat failed.out; fail "--dataset $dataset exited with $status, expected 3"; }
  grep -qF -- "$text" failed.out || { cat failed.out; fail "--dataset $dataset: no '$text'"; }
  echo "refused: --dataset $dataset: $(grep -m1 -F -- "$text" failed.out)"
}
hpc_train_fails "the pattern 'parts/nothing-*.h5' matches no file" 'parts/nothing-*.h5'
sed 's/^slice-00001-of-00003.h5 83 20$/slice-00001-of-00003.h5 83 21/' parts/slice.shards > parts/count.shards
hpc_train_fails "parts/count.shards line 4: shard parts/slice-00001-of-00003.h5 holds 20 test samples, the index says 21" \
  parts/count.shards
sed 's/^slice-00002-of-00003.h5/slice-00003-of-00003.h5/' parts/slice.shards > parts/missing.shards
hpc_train_fails "parts/missing.shards line 5: shard parts/slice-00003-of-00003.h5: no such file" \
  parts/missing.shards
# Shards of another slice (other images, so another mean and std) beside these.
"$HPC_TRAIN_DATA" convert fashion-mnist "${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" \
  other.h5 --max-train 100 --max-test 10 > /dev/null
"$HPC_TRAIN_DATA" shard other.h5 --shards 2 parts/slix > /dev/null
hpc_train_fails "shard parts/slix-00000-of-00002.h5 has mean" 'parts/sli*-0000[01]-of-*.h5'
grep -qF "but shard parts/slice-00000-of-00003.h5 has" failed.out || fail "the mismatch names one file"

echo "== 6. shard holds a block in memory, not a shard"
# 256 MiB of samples (65536 of 1x64x64) cut into 2 shards of 128 MiB: the peak resident memory of
# shard may exceed inspect's (the same open of the file) by a block (16 MiB), not by a shard.
"$HPC_TRAIN_WRITE_SYNTHETIC_DATASET" big.h5 65536 1 64 64 > /dev/null
# peak_mib COMMAND...: the largest resident set of COMMAND, MiB.
peak_mib() {
  python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)' "$@"
}
mkdir big
inspect_mib=$(peak_mib "$HPC_TRAIN_DATA" inspect big.h5)
shard_mib=$(peak_mib "$HPC_TRAIN_DATA" shard big.h5 --shards 2 big/big)
echo "peak resident memory: inspect ${inspect_mib} MiB, shard ${shard_mib} MiB"
((shard_mib - inspect_mib < 64)) || fail "shard held ${shard_mib} MiB, inspect ${inspect_mib} MiB"
"$HPC_TRAIN_DATA" inspect big/big.shards | grep -qE "^  train: +65536 samples" ||
  fail "the big shards do not hold the 65536 samples"
rm -rf big big.h5
echo "PASS"

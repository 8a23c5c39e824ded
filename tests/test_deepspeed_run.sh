#!/usr/bin/env bash
# The origin's DeepSpeed config through hpc_train itself: train_batch_size 64 cannot be split
# over 3 ranks (a clear error, exit 2, every rank), and runs on 1 and 2 ranks with the derived
# micro-batch; an unknown key and a type error are usage errors that name the key.
set -euo pipefail
work="$HPC_TRAIN_TEST_WORK"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
configs="$HPC_TRAIN_SOURCE_DIR/configs"
source_dir=${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
"$HPC_TRAIN_DATA" convert fashion-mnist "$source_dir" small.h5 --max-train 600 --max-test 200 > /dev/null
failures=0
fail() { echo "FAIL $1"; cat "$2"; failures=$((failures + 1)); }

# hpc_train RANKS NAME OPTIONS... -> exit code in $rc, output in NAME.out / NAME.err
hpc_train() {
  local ranks=$1 name=$2
  shift 2
  set +e
  timeout 120 "$MPIEXEC" -np "$ranks" --oversubscribe "$HPC_TRAIN" --dataset small.h5 \
    --run-dir "run-$name" "$@" > "$name.out" 2> "$name.err"
  rc=$?
  set -e
}

hpc_train 3 origin-3 --deepspeed-config "$configs/ds_origin.json"
if [ "$rc" -eq 2 ] && grep -q "train_batch_size 64 must equal .* (21 x 1 x 3 = 63 with 3 ranks)" origin-3.err \
   && grep -q "e.g. 63 or 66" origin-3.err; then echo "ok   origin config at 3 ranks: exit 2, says why"
else fail "origin config at 3 ranks: exit $rc" origin-3.err; fi

# LibTorch 1.13 has no fp16 convolution on the CPU: the batch arithmetic is what is tested here.
for ranks in 1 2; do
  hpc_train "$ranks" "origin-$ranks" --deepspeed-config "$configs/ds_origin.json" \
    --precision fp32 --max-steps 3 --log-every 1
  micro=$((64 / ranks))
  if [ "$rc" -eq 0 ] && grep -qx "micro_batch = $micro" "run-origin-$ranks/config.ini" \
     && grep -qx "zero_stage = 2" "run-origin-$ranks/config.ini" \
     && grep -q "global batch 64 ($micro x 1 micro-steps x $ranks ranks)" "origin-$ranks.out"; then
    echo "ok   origin config at $ranks rank(s): micro-batch $micro, ZeRO stage 2"
  else fail "origin config at $ranks rank(s): exit $rc" "origin-$ranks.err"; fi
done

printf '{"train_batch_size": 64, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "foo": 1}}}\n' > unknown.json
hpc_train 2 unknown --deepspeed-config unknown.json
if [ "$rc" -eq 2 ] && grep -q "optimizer.params.foo" unknown.err && grep -q "weight_decay" unknown.err; then
  echo "ok   unknown key: exit 2, lists the known keys"
else fail "unknown key: exit $rc" unknown.err; fi

printf '{"train_batch_size": "64"}\n' > type.json
hpc_train 2 type --deepspeed-config type.json
if [ "$rc" -eq 2 ] && grep -q "train_batch_size" type.err; then echo "ok   type error: exit 2"
else fail "type error: exit $rc" type.err; fi

[ "$failures" -eq 0 ] && echo "all DeepSpeed config cases passed" || exit 1

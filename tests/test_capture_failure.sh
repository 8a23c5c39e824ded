#!/usr/bin/env bash
# Note [Failed capture] on the GPU (one rank): vgg11_bn (dropout draws from the CUDA generator) on
# the first 320 Fashion-MNIST images zero-padded to 32x32, one epoch of 10 steps, --deterministic.
# HPC_TRAIN_TEST_FAULT=capture@0 (Note [Test hooks]) makes the capture of step 4 throw half-way
# through its backward, with buckets started and gradients left in `.grad`:
#   - --cuda-graph auto falls back to eager steps, says why, replays nothing, and ends bitwise
#     equal to a run with --cuda-graph off: the failed capture left nothing behind (reducer,
#     gradients, random generators);
#   - --cuda-graph on ends with an error naming the failure.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"
check=$HPC_TRAIN_SOURCE_DIR/tests/support/check_safetensors.py
python=$(python_with numpy) || fail "no python3 with numpy"
"$python" "$HPC_TRAIN_SOURCE_DIR/tests/support/source_datasets.py" padded-idx \
  "${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" slice32.npz \
  --train 320 --test 64 --side 32
"$HPC_TRAIN_DATA" convert npz slice32.npz slice.h5 --num-classes 10 > /dev/null

common=(--model vgg11_bn --dataset slice.h5 --device cuda --epochs 1 --micro-batch 32
        --deterministic --checkpoint-epochs off --progress lines --log-every 5)
train() {  # train RUN_DIR [options...]
  local run_dir=$1
  shift
  timeout 300 "$MPIEXEC" -np 1 "$HPC_TRAIN" "${common[@]}" --run-dir "$run_dir" "$@" \
    > "$run_dir.out" 2>&1 || { cat "$run_dir.out"; fail "run $run_dir failed"; }
}
replays() { python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['graph_replays'])" "$1/summary.json"; }

train eager --cuda-graph off --export-weights eager.safetensors
HPC_TRAIN_TEST_FAULT=capture@0 train failed --cuda-graph auto --export-weights failed.safetensors
grep -q "CUDA graph capture failed (.*test fault capture: the captured backward fails after" failed.out ||
  { cat failed.out; fail "the capture did not fail by the test fault, or the run did not say so"; }
[ "$(replays failed)" = 0 ] || fail "$(replays failed) graph replays after a failed capture"
python3 "$check" failed.safetensors --compare eager.safetensors --quiet ||
  fail "the run whose capture failed ends elsewhere than the eager run"

# Required graphs: the failure ends the run, naming it.
status=0
HPC_TRAIN_TEST_FAULT=capture@0 timeout 300 "$MPIEXEC" -np 1 "$HPC_TRAIN" "${common[@]}" \
  --run-dir required --cuda-graph on > required.out 2>&1 || status=$?
[ "$status" -ne 0 ] || fail "--cuda-graph on went on after a failed capture"
grep -q -- "--cuda-graph on: capturing the step failed: .*test fault capture" required.out ||
  { cat required.out; fail "--cuda-graph on did not name the failed capture"; }
echo "capture failure passed"

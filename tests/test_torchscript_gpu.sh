#!/usr/bin/env bash
# A scripted resnet18 trains with graph replays (GPU build, one rank on the GPU, the NCCL
# backend). The module is bench/reference/models.py's ResNet18 (the built-in's names), scripted
# by the PyTorch of this machine (tests/support/torchscript_models.py), on learnable synthetic
# CIFAR-shaped data (2048 train samples: 30 steps of 64 are all full batches):
#   fp32, bf16 (ZeRO-2) and fp16 (dynamic loss scaling), each --cuda-graph on: exit 0, the step
#     captured once and replayed from the 4th step on (graph_replays >= 25 of 30), the loss of
#     the last step below the first, MFU reported as unknown (summary.json mfu 0);
#   the built-in resnet18 given the same --init-weights: the first step's loss (the same weights
#     on the same batch, --deterministic) within 1e-4 of the scripted module's; the built-in's
#     MFU is counted (> 0).
set -euo pipefail
work="$HPC_TRAIN_TEST_WORK"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
support=$HPC_TRAIN_SOURCE_DIR/tests/support
python=""
for candidate in python3 /usr/bin/python3; do
  if "$candidate" -c 'import torch' 2> /dev/null; then python=$candidate; break; fi
done
[ -n "$python" ] || { echo "FAIL: no python3 with torch (the PyTorch of this LibTorch)"; exit 1; }
models() { "$python" "$support/torchscript_models.py" "$@"; }
failures=0

models cifar-bin cifar --train 2048 --test 256
"$HPC_TRAIN_DATA" convert cifar10 cifar cifar.h5 > /dev/null
models script resnet18 resnet18.pt --shape 3,32,32 --classes 10 --seed 0
models script resnet18 unused.pt --shape 3,32,32 --classes 10 --seed 1 --state-dict init.safetensors

common=(--dataset cifar.h5 --device cuda --backend nccl --epochs 1 --max-steps 30
        --micro-batch 64 --log-every 1 --checkpoint-epochs off --progress lines --augment off
        --cuda-graph on)
train() {  # train NAME [options...]
  local name=$1
  shift
  timeout 300 "$MPIEXEC" -np 1 "$HPC_TRAIN" "${common[@]}" --run-dir "$name" "$@" \
    > "$name.out" 2>&1 || { echo "FAIL: run $name failed:"; cat "$name.out"; exit 1; }
}
# summary NAME KEY
summary() {  # summary NAME KEY: a number of NAME/summary.json, %g-formatted (0.0 prints 0)
  "$python" -c 'import json, sys; print("%g" % json.load(open(sys.argv[1]))[sys.argv[2]])' \
    "$1/summary.json" "$2"
}
first_and_last_loss() {
  "$python" -c 'import json, sys
losses = [r["loss"] for r in map(json.loads, open(sys.argv[1])) if r["kind"] == "train"]
print(repr(losses[0]), repr(losses[-1]))' "$1/metrics.jsonl"
}

check_scripted() {  # check_scripted NAME: the checks of a scripted run
  local name=$1 replays first last
  replays=$(summary "$name" graph_replays)
  read -r first last < <(first_and_last_loss "$name")
  if grep -q "Training step captured as a CUDA graph" "$name.out" && [ "$replays" -ge 25 ] &&
     grep -q "MFU: unknown for resnet18.pt" "$name.out" && [ "$(summary "$name" mfu)" = 0 ] &&
     "$python" -c 'import sys; sys.exit(0 if float(sys.argv[2]) < float(sys.argv[1]) else 1)' \
       "$first" "$last"; then
    echo "ok   $name: $replays graph replays, loss $first -> $last"
  else
    echo "FAIL $name: replays $replays (want >= 25), loss $first -> $last (want lower), mfu" \
         "$(summary "$name" mfu) (want 0 and a log line); output:"
    cat "$name.out"
    failures=$((failures + 1))
  fi
}

train scripted-fp32 --model resnet18.pt --init-weights init.safetensors --deterministic
check_scripted scripted-fp32
train scripted-bf16 --model resnet18.pt --precision bf16 --zero-stage 2
check_scripted scripted-bf16
# A dynamic scale from 2^10: no overflow (a skipped step) delays the capture at the start.
train scripted-fp16 --model resnet18.pt --precision fp16 --initial-scale-power 10
check_scripted scripted-fp16

train builtin-fp32 --model resnet18 --init-weights init.safetensors --deterministic
read -r builtin_first _ < <(first_and_last_loss builtin-fp32)
read -r scripted_first _ < <(first_and_last_loss scripted-fp32)
"$python" -c 'import sys
a, b = float(sys.argv[1]), float(sys.argv[2])
print(f"first loss: scripted {a!r}, built-in {b!r}, relative difference {abs(a - b) / abs(b):.3g}")
sys.exit(0 if abs(a - b) <= 1e-4 * abs(b) else 1)' "$scripted_first" "$builtin_first" ||
  { echo "FAIL: the scripted resnet18's first loss differs from the built-in's"; failures=$((failures + 1)); }
"$python" -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)' "$(summary builtin-fp32 mfu)" ||
  { echo "FAIL: the built-in's MFU is not counted"; failures=$((failures + 1)); }

[ "$failures" -eq 0 ] && echo "a scripted resnet18 trains with graph replays" ||
  { echo "$failures check(s) failed"; exit 1; }

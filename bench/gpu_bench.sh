#!/usr/bin/env bash
# hpc_train against the PyTorch reference (bench/reference/train_reference.py), side by side in
# one run on one GPU: ms/step, samples/s and their ratio for each case, then the origin's whole
# job (simple_cnn, 10 epochs, Fashion-MNIST): wall time and test accuracy of both.
#   bench/gpu_bench.sh BUILD_DIR FASHION_MNIST_IDX_DIR [OUT_DIR]
# hpc_train's ms/step is its summary's (warm-up step excluded); PyTorch's is CUDA-event timed
# after 30 warm-up steps.
set -euo pipefail
build=$(cd "$1" && pwd); idx=$(cd "$2" && pwd); out=${3:-bench-out}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out" && cd "$out"
steps=${BENCH_STEPS:-300}
[ -f fm.h5 ] || "$build/hpc_train_data" convert fashion-mnist "$idx" fm.h5 > /dev/null
[ -f cifar_synthetic.h5 ] || python3 "$here/make_synthetic_cifar.py" cifar_synthetic.h5 20000

# PyTorch's three ways, each in its own process (bench/reference/train_reference.py --mode): eager;
# the whole step in one CUDA graph; torch.compile(max-autotune), only with BENCH_COMPILE=1 (resnet18
# compiles for minutes; its compile time goes to torch-NAME-compile.json, warmup_s). "vs best":
# the best PyTorch ms/step over hpc_train's (> 1: hpc_train is faster).
# BENCH_ONLY=REGEX runs only the cases whose names match (BENCH_MACHINERY=0 and BENCH_WHOLE_JOB=0
# leave out the two other parts).
compile=${BENCH_COMPILE:-0} only=${BENCH_ONLY:-}
printf '%-34s %9s %9s %9s %9s %8s %8s %7s %8s\n' case "hpc ms" "eager ms" "graph ms" "compile ms" \
  "vs eager" "vs best" "hpc MFU" replayed
run_case() {  # NAME DATASET MODEL BATCH PRECISION [hpc_train options...]
  # A scripted model NAME.pt is compared with PyTorch's NAME: the same network, in Python.
  local name=$1 data=$2 model=$3 batch=$4 precision=$5 mode modes=(eager graph)
  local reference_model=${3%.pt}
  shift 5
  if [ -n "$only" ] && ! [[ $name =~ $only ]]; then return 0; fi
  mpirun -np 1 "$build/hpc_train" --dataset "$data" --model "$model" --micro-batch "$batch" \
    --precision "$precision" --max-steps "$steps" --log-every "$steps" --run-dir "run-$name" \
    "$@" > "hpc-$name.log" 2>&1 || { echo "hpc_train failed: $name"; tail -5 "hpc-$name.log"; return 1; }
  [ "$compile" = 1 ] && modes+=(compile)
  for mode in "${modes[@]}"; do
    python3 "$here/reference/train_reference.py" --dataset "$data" --model "$reference_model" \
      --batch "$batch" --precision "$precision" --steps "$steps" --mode "$mode" \
      > "torch-$name-$mode.json" 2> "torch-$name-$mode.log" || rm -f "torch-$name-$mode.json"
  done
  python3 - "$name" "run-$name/summary.json" torch-"$name"-{eager,graph,compile}.json <<'PY'
import json, os, sys
name, ours = sys.argv[1], json.load(open(sys.argv[2]))
theirs = [json.load(open(p))['ms_per_step'] if os.path.exists(p) else None for p in sys.argv[3:]]
cell = lambda ms: f"{ms:9.3f}" if ms is not None else f"{'-':>9}"
best = min(ms for ms in theirs if ms is not None)
print(f"{name:<34} {ours['ms_per_step']:9.3f} {' '.join(cell(ms) for ms in theirs)} "
      f"{theirs[0] / ours['ms_per_step']:8.2f} {best / ours['ms_per_step']:8.2f} "
      f"{100 * ours.get('mfu', 0):6.1f}% {ours.get('graph_replays', 0):4d}/{ours['steps']}")
PY
}
for p in fp32 fp16 bf16; do run_case "simple_cnn-b64-$p" fm.h5 simple_cnn 64 "$p"; done
# hpc_train replays its step from a CUDA graph by default; -eager turns that off.
run_case "simple_cnn-b64-bf16-eager" fm.h5 simple_cnn 64 bf16 --cuda-graph off
run_case "simple_cnn-b64-bf16-zero2" fm.h5 simple_cnn 64 bf16 --zero-stage 2
# LibTorch's max pooling, add and ReLU instead of the fused kernel (Note [Fused pooling]), still
# NHWC; and the network NCHW as before the fused kernel (one-channel images, contiguous weights).
run_case "simple_cnn-b64-bf16-unfused" fm.h5 simple_cnn 64 bf16 --fused-pooling off
run_case "simple_cnn-b64-bf16-nchw" fm.h5 simple_cnn 64 bf16 --channels-last off
# The reference does not augment: neither does hpc_train here (--augment auto would, for
# CIFAR-like data).
run_case "resnet18-b256-bf16" cifar_synthetic.h5 resnet18 256 bf16 --zero-stage 2 --augment off
# What TorchScript costs: the same resnet18 (bench/reference/models.py's, the built-in's names)
# scripted by this machine's PyTorch and trained from the file.
if [ -z "$only" ] || [[ resnet18-scripted-b256-bf16 =~ $only ]]; then
  python3 "$here/../tests/support/torchscript_models.py" script resnet18 resnet18.pt \
    --shape 3,32,32 --classes 10 --seed 0
fi
run_case "resnet18-scripted-b256-bf16" cifar_synthetic.h5 resnet18.pt 256 bf16 --zero-stage 2 \
  --augment off
# LibTorch's batch norm, add and ReLU instead of the fused kernels (Note [Fused batch norm]).
run_case "resnet18-b256-bf16-unfused" cifar_synthetic.h5 resnet18 256 bf16 --zero-stage 2 \
  --augment off --fused-batch-norm off
run_case "resnet18-b256-bf16-eager" cifar_synthetic.h5 resnet18 256 bf16 --zero-stage 2 --augment off \
  --cuda-graph off
# cuDNN's autotuning, which the PyTorch reference always has on (Note [cuDNN autotuning] in
# run_options.h: the micro-batch's shape is tuned in the eager steps before the capture).
run_case "resnet18-b256-bf16-cudnn-benchmark" cifar_synthetic.h5 resnet18 256 bf16 --zero-stage 2 \
  --augment off --cudnn-benchmark on

# ResNet-50 as on ImageNet (torchvision's network: 7x7 stem and max pooling) at 224 pixels,
# batch 128: a step of about 1.6 TFLOP, where resnet18 on CIFAR at 256 is one of 0.43.
if [ -z "$only" ] || [[ resnet50-224-b128-bf16 =~ $only ]]; then
  [ -f imagenet_synthetic.h5 ] || python3 "$here/make_synthetic_cifar.py" imagenet_synthetic.h5 2560 224 512
fi
run_case "resnet50-224-b128-bf16" imagenet_synthetic.h5 resnet50_imagenet 128 bf16 --zero-stage 2 \
  --augment off

# The distributed machinery (an NCCL world of one, ZeRO-2's reduce-scatter and all-gather,
# gradient buckets) against the same run with it switched off (--backend none: every
# collective of a one-rank world is skipped; ZeRO stage 0). Then its two halves apart: the NCCL
# world alone (ZeRO stage 0) and ZeRO-2's partitioned state alone (--backend none), each against
# off, so that a cost names its half.
machinery() {  # NAME MODEL DATASET BATCH [hpc_train options...]
  # Twice each side, alternating: the spread between the two runs of a side is the noise that a
  # difference between the sides has to beat.
  local name=$1 model=$2 data=$3 batch=$4 mode rep
  shift 4
  local -A backend=([on]=nccl [off]=none [nccl]=nccl [zero2]=none)
  local -A stage=([on]=2 [off]=0 [nccl]=0 [zero2]=2)
  for rep in 1 2; do
    for mode in on off nccl zero2; do
      mpirun -np 1 "$build/hpc_train" --dataset "$data" --model "$model" --micro-batch "$batch" \
        --precision bf16 --max-steps "$steps" --log-every "$steps" --run-dir "run-$name-$mode$rep" \
        --backend "${backend[$mode]}" --zero-stage "${stage[$mode]}" "$@" \
        > "hpc-$name-$mode$rep.log" 2>&1 ||
        { echo "hpc_train failed: $name $mode"; tail -5 "hpc-$name-$mode$rep.log"; return 1; }
    done
  done
  python3 - "$name" run-"$name" <<'PY'
import json, sys
name, runs = sys.argv[1], sys.argv[2]
ms = {mode: [json.load(open(f"{runs}-{mode}{rep}/summary.json"))['ms_per_step'] for rep in (1, 2)]
      for mode in ("on", "off", "nccl", "zero2")}
best = {mode: min(pair) for mode, pair in ms.items()}
pair = lambda mode: "/".join(f"{x:.3f}" for x in ms[mode])
print(f"machinery {name:<24} on {pair('on')} ms/step, off {pair('off')} ms/step: "
      f"costs {100 * (best['on'] / best['off'] - 1):+.1f}% (best of two each)")
print(f"  its halves: NCCL world of one alone {pair('nccl')} ms/step "
      f"({100 * (best['nccl'] / best['off'] - 1):+.1f}%), ZeRO-2 alone {pair('zero2')} ms/step "
      f"({100 * (best['zero2'] / best['off'] - 1):+.1f}%)")
PY
}
if [ "${BENCH_MACHINERY:-1}" = 1 ]; then
  machinery simple_cnn-b64-bf16 simple_cnn fm.h5 64
  machinery resnet18-b256-bf16 resnet18 cifar_synthetic.h5 256 --augment off
fi

if [ "${BENCH_WHOLE_JOB:-1}" = 1 ]; then
  mpirun -np 1 "$build/hpc_train" --dataset fm.h5 --epochs 10 --run-dir run-whole \
    --export-weights run-whole/weights.safetensors > hpc-whole.log 2>&1
  python3 "$here/reference/train_reference.py" --dataset fm.h5 --epochs 10 > torch-whole.json
  python3 - run-whole/summary.json torch-whole.json <<'PY'
import json, sys
ours, theirs = json.load(open(sys.argv[1])), json.loads(open(sys.argv[2]).read())
print(f"whole job (simple_cnn, 10 epochs): hpc_train {ours['wall_s']:.1f} s, "
      f"{100 * ours['test_accuracy']:.2f}%; PyTorch {theirs['wall_s']:.1f} s, "
      f"{100 * theirs['test_accuracy']:.2f}%; speed-up {theirs['wall_s'] / ours['wall_s']:.2f}x")
PY
  # The exported weights in PyTorch's definition of the network (strict load_state_dict).
  python3 "$here/reference/load_safetensors.py" run-whole/weights.safetensors --dataset fm.h5
  # The same job in bf16, timed as the origin's job is (origin_job.sh): BENCH_ORIGIN_RUNS runs
  # (1; issue 16's figures take 7, one cold and six warm).
  "$here/origin_job.sh" "$build" "$idx" origin-job "${BENCH_ORIGIN_RUNS:-1}"
fi

#!/usr/bin/env bash
# hpc_train against the PyTorch reference (bench/reference/train_reference.py), side by side in
# one run on one GPU: ms/step, samples/s and their ratio for each case, then the origin's whole
# job (simple_cnn, 10 epochs, Fashion-MNIST): wall time and test accuracy of both.
#   bench/gpu_bench.sh BUILD_DIR FASHION_MNIST_IDX_DIR [OUT_DIR]
# hpc_train's ms/step is its summary's (warm-up step excluded); PyTorch's is CUDA-event timed
# after 30 warm-up steps.
set -euo pipefail
build=$(cd "$1" && pwd); idx=$2; out=${3:-bench-out}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out" && cd "$out"
steps=${BENCH_STEPS:-300}
[ -f fm.h5 ] || "$build/hpc_train_data" convert fashion-mnist "$idx" fm.h5 > /dev/null
[ -f cifar_synthetic.h5 ] || python3 "$here/make_synthetic_cifar.py" cifar_synthetic.h5 20000

printf '%-34s %12s %12s %12s %12s %8s\n' case "hpc ms/step" "torch ms/step" "hpc samples/s" "torch samples/s" ratio
run_case() {  # NAME DATASET MODEL BATCH PRECISION [hpc_train options...]
  local name=$1 data=$2 model=$3 batch=$4 precision=$5
  shift 5
  mpirun -np 1 "$build/hpc_train" --dataset "$data" --model "$model" --micro-batch "$batch" \
    --precision "$precision" --max-steps "$steps" --log-every "$steps" --run-dir "run-$name" \
    "$@" > "hpc-$name.log" 2>&1 || { echo "hpc_train failed: $name"; tail -5 "hpc-$name.log"; return 1; }
  python3 "$here/reference/train_reference.py" --dataset "$data" --model "$model" \
    --batch "$batch" --precision "$precision" --steps "$steps" > "torch-$name.json"
  python3 - "$name" "run-$name/summary.json" "torch-$name.json" <<'PY'
import json, sys
name, ours, theirs = sys.argv[1], json.load(open(sys.argv[2])), json.loads(open(sys.argv[3]).read())
print(f"{name:<34} {ours['ms_per_step']:12.3f} {theirs['ms_per_step']:12.3f} "
      f"{ours['samples_per_s']:12.0f} {theirs['samples_per_s']:12.0f} "
      f"{ours['samples_per_s'] / theirs['samples_per_s']:8.2f}")
PY
}
for p in fp32 fp16 bf16; do run_case "simple_cnn-b64-$p" fm.h5 simple_cnn 64 "$p"; done
run_case "simple_cnn-b64-bf16-zero2" fm.h5 simple_cnn 64 bf16 --zero-stage 2
run_case "resnet18-b256-bf16" cifar_synthetic.h5 resnet18 256 bf16 --zero-stage 2

if [ "${BENCH_WHOLE_JOB:-1}" = 1 ]; then
  mpirun -np 1 "$build/hpc_train" --dataset fm.h5 --epochs 10 --run-dir run-whole > hpc-whole.log 2>&1
  python3 "$here/reference/train_reference.py" --dataset fm.h5 --epochs 10 > torch-whole.json
  python3 - run-whole/summary.json torch-whole.json <<'PY'
import json, sys
ours, theirs = json.load(open(sys.argv[1])), json.loads(open(sys.argv[2]).read())
print(f"whole job (simple_cnn, 10 epochs): hpc_train {ours['wall_s']:.1f} s, "
      f"{100 * ours['test_accuracy']:.2f}%; PyTorch {theirs['wall_s']:.1f} s, "
      f"{100 * theirs['test_accuracy']:.2f}%; speed-up {theirs['wall_s'] / ours['wall_s']:.2f}x")
PY
fi

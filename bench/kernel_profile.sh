#!/usr/bin/env bash
# Where the time of one training step goes, kernel by kernel, for hpc_train and for PyTorch's
# whole step in one CUDA graph (bench/reference/train_reference.py --mode graph), one GPU:
#   bench/kernel_profile.sh BUILD_DIR FASHION_MNIST_IDX_DIR [OUT_DIR]
# Nsight Compute (ncu) times every kernel of the profiled steps (gpu__time_duration, one metric,
# clocks left alone): hpc_train's steps from --cuda-profiler-start-step (warmed up, replayed from
# its CUDA graph), the reference's timed steps (--cuda-profiler); start-up, warm-up, capture and
# evaluation run outside the profiler's capture. ncu runs kernels one at a time: their sum is
# the GPU's busy time per step, and its gap to the measured ms/step (gpu_bench.sh) is time the
# GPU sat idle between kernels.
set -euo pipefail
build=$(cd "$1" && pwd); idx=$(cd "$2" && pwd); out=${3:-profile-out}
here=$(cd "$(dirname "$0")" && pwd)
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | tail -1) ||
  { echo "no ncu (Nsight Compute) on this machine"; exit 1; }
mkdir -p "$out" && cd "$out"
[ -f fm.h5 ] || "$build/hpc_train_data" convert fashion-mnist "$idx" fm.h5 > /dev/null
[ -f cifar_synthetic.h5 ] || python3 "$here/make_synthetic_cifar.py" cifar_synthetic.h5 20000
# PROFILE_REFERENCE=no profiles hpc_train alone (PyTorch's side of a case takes the longer).
# PROFILE_REFERENCE_MODE=compile profiles torch.compile(max-autotune)'s step instead of the
# whole-step graph (it compiles and autotunes for minutes before its timed steps).
# PROFILE_CACHE=none leaves the caches warm between kernels, as in a real step, where a kernel
# finds much of its input in L2 (50 MB on an H100); ncu's default flushes them before each one.
steps=${PROFILE_STEPS:-3} only=${PROFILE_ONLY:-} with_reference=${PROFILE_REFERENCE:-yes}
reference_mode=${PROFILE_REFERENCE_MODE:-graph} cache_control=${PROFILE_CACHE:-all}

profiled() {  # profiled CSV COMMAND...: every kernel's time, as ncu's CSV
  local csv=$1
  shift
  "$ncu" --clock-control none --cache-control "$cache_control" --profile-from-start off \
    --target-processes all \
    --metrics gpu__time_duration.sum --csv --print-units base --log-file "$csv" "$@" > "${csv%.csv}.out" 2>&1 ||
    { echo "profiled run failed: $*"; tail -5 "${csv%.csv}.out"; return 1; }
}

profile_case() {  # NAME DATASET MODEL BATCH REFERENCE(yes|no) [hpc_train options...]
  local name=$1 data=$2 model=$3 batch=$4 reference=$5
  shift 5
  if [ -n "$only" ] && ! [[ $name =~ $only ]]; then return 0; fi
  # Steps 20 on: past the eager warm-up, the bucket rebuild and the capture.
  profiled "hpc-$name.csv" mpirun -np 1 "$build/hpc_train" --dataset "$data" --model "$model" \
    --micro-batch "$batch" --precision bf16 --max-steps $((20 + steps)) --log-every 100 \
    --cuda-profiler-start-step 20 --cuda-profiler-steps "$steps" --run-dir "run-$name" "$@"
  if [ "$reference" = yes ] && [ "$with_reference" = yes ]; then
    profiled "torch-$name.csv" python3 "$here/reference/train_reference.py" --dataset "$data" \
      --model "$model" --batch "$batch" --precision bf16 --mode "$reference_mode" --warmup 5 \
      --steps "$steps" --cuda-profiler
  fi
  python3 - "$name" "$steps" "hpc-$name.csv" "torch-$name.csv" <<'PY'
import collections, csv, os, sys

def kernel_ns(path):
    """Total ns and launches per kernel name in one ncu CSV log."""
    lines = open(path, errors="replace").read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    total, count = collections.Counter(), collections.Counter()
    for row in csv.DictReader(lines[start:]):
        if row.get("Metric Name") == "gpu__time_duration.sum":
            name = row["Kernel Name"]
            total[name] += float(row["Metric Value"].replace(",", ""))
            count[name] += 1
    return total, count

name, steps = sys.argv[1], int(sys.argv[2])
for who, path in (("hpc_train", sys.argv[3]), ("PyTorch", sys.argv[4])):
    if not os.path.exists(path):
        continue
    total, count = kernel_ns(path)
    busy_us = sum(total.values()) / 1e3 / steps
    print(f"{name} {who}: {busy_us:.1f} us of kernels per step, "
          f"{sum(count.values()) / steps:.0f} launches per step")
    for kernel, ns in total.most_common(15):
        print(f"  {ns / 1e3 / steps:8.1f} us {100 * ns / 1e3 / steps / busy_us:5.1f}% "
              f"x{count[kernel] / steps:<4.0f} {kernel[:110]}")
PY
}
profile_case simple_cnn-b64-bf16 fm.h5 simple_cnn 64 yes
profile_case resnet18-b256-bf16 cifar_synthetic.h5 resnet18 256 yes --zero-stage 2 --augment off
# hpc_train's resnet18 with cuDNN's autotuning: which kernels it chose instead.
profile_case resnet18-b256-bf16-cudnn-benchmark cifar_synthetic.h5 resnet18 256 no --zero-stage 2 \
  --augment off --cudnn-benchmark on

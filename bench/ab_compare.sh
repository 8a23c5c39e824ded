#!/usr/bin/env bash
# Builds of hpc_train against each other on one GPU, their runs interleaved, so that a change's
# effect on the step is measured on one machine in one call:
#   bench/ab_compare.sh BUILD_DIR_A BUILD_DIR_B [BUILD_DIR_C ...]
# e.g. A built from `git archive` of the base commit, B from the working tree. Each case runs
# AB_REPEATS (3) times per build, round-robin (A B C A B C ...), so that drift over the call
# spreads over every build alike. One line per case and build: every run's ms/step (summary.json,
# warm-up step excluded), their median, and that median over A's (below 1: faster than A);
# then the allocator's peak per rank. AB_ONLY=REGEX picks cases, AB_OUT (ab-out) is the working
# directory, AB_OPTIONS adds hpc_train options to every run (e.g. "--cudnn-benchmark on"), AB_STEPS
# sets every case's steps (300 for resnet18, 100 for resnet50).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 BUILD_DIR_A BUILD_DIR_B [BUILD_DIR ...]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
builds=()
for b in "$@"; do builds+=("$(cd "$b" && pwd)"); done
out=${AB_OUT:-ab-out} repeats=${AB_REPEATS:-3} only=${AB_ONLY:-}
read -r -a extra <<< "${AB_OPTIONS:-}"
mkdir -p "$out" && cd "$out"

ab_case() {  # NAME DATASET MODEL BATCH STEPS [hpc_train options...]
  local name=$1 data=$2 model=$3 batch=$4 steps=${AB_STEPS:-$5} rep i
  shift 5
  if [ -n "$only" ] && ! [[ $name =~ $only ]]; then return 0; fi
  for rep in $(seq "$repeats"); do
    for i in "${!builds[@]}"; do
      rm -rf "run-$name-$i-$rep"
      mpirun -np 1 "${builds[$i]}/hpc_train" --dataset "$data" --model "$model" \
        --micro-batch "$batch" --precision bf16 --max-steps "$steps" --log-every "$steps" \
        --run-dir "run-$name-$i-$rep" "$@" "${extra[@]}" > "log-$name-$i-$rep" 2>&1 ||
        { echo "build $i failed: $name"; tail -5 "log-$name-$i-$rep"; return 1; }
    done
  done
  python3 - "$name" "${#builds[@]}" "$repeats" "${builds[@]}" <<'PY'
import json, statistics, sys
name, n, repeats, builds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
summaries = [[json.load(open(f"run-{name}-{i}-{rep}/summary.json")) for rep in range(1, repeats + 1)]
             for i in range(n)]
medians = [statistics.median(s["ms_per_step"] for s in runs) for runs in summaries]
for i, runs in enumerate(summaries):
    times = " ".join(f"{s['ms_per_step']:.3f}" for s in runs)
    # The allocator's peak, one entry per rank (none without a GPU).
    peaks = [max(s.get("peak_allocated_bytes_per_rank") or [0]) for s in runs]
    print(f"{name:<26} {chr(65 + i)} {times}  median {medians[i]:.3f} ms"
          f"  x{medians[i] / medians[0]:.3f}  peak {max(peaks) / 1e9:.2f} GB  ({builds[i]})")
PY
}

[ -f cifar_synthetic.h5 ] || python3 "$here/make_synthetic_cifar.py" cifar_synthetic.h5 20000 > /dev/null
ab_case resnet18-b256-bf16 cifar_synthetic.h5 resnet18 256 300 --zero-stage 2 --augment off
if [ -z "$only" ] || [[ resnet50-224-b128-bf16 =~ $only ]]; then
  [ -f imagenet_synthetic.h5 ] ||
    python3 "$here/make_synthetic_cifar.py" imagenet_synthetic.h5 2560 224 512 > /dev/null
fi
ab_case resnet50-224-b128-bf16 imagenet_synthetic.h5 resnet50_imagenet 128 100 --zero-stage 2 \
  --augment off

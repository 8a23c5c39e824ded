#!/usr/bin/env bash
# Per-rank memory at each ZeRO stage and world size, as hpc_train measures and reports it
# (summary.json: parameter_bytes_per_rank, gradient_bytes_per_rank, optimizer_state_bytes_per_rank
# and the peak), beside the ZeRO paper's formula for the same Ψ parameters:
#   16-bit model (fp32 master weights and Adam moments, K = 12):
#     stage 0: 2Ψ + 2Ψ + 12Ψ   stage 1: 2Ψ + 2Ψ + 12Ψ/N   stage 2: 2Ψ + (2 + 12)Ψ/N
#   fp32 model (the parameters are the master weights, K = 8):
#     stage 0: 4Ψ + 4Ψ + 8Ψ    stage 1: 4Ψ + 4Ψ + 8Ψ/N    stage 2: 4Ψ + (4 + 8)Ψ/N
# hpc_train's stage 2 adds two staging buckets of gradients (Note [Partitioned gradients]), and
# every bucket is padded to a multiple of N x 16 elements.
#   bench/memory_table.sh BUILD_DIR DATASET.h5 [OUT_DIR] [hpc_train options...]
# MEMORY_RANKS (default "1 2 3 4 8") and MEMORY_STAGES ("0 1 2"); MEMORY_STEPS (3) steps each.
# The peak column is each rank's peak resident memory on the CPU (libraries and data included,
# so it moves less than the rows above it), or LibTorch's allocator peak on a GPU; the largest
# over ranks. On the CPU the ranks are oversubscribed, one thread each. Several ranks on one GPU
# need --backend mpi (NCCL refuses two ranks on one GPU).
set -euo pipefail
build=$(cd "$1" && pwd); dataset=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); out=${3:-memory-out}
shift $(( $# < 3 ? $# : 3 ))
mkdir -p "$out" && cd "$out"
printf '%-5s %-5s %10s %10s %10s %10s %10s %12s %8s\n' ranks stage "params MB" "grads MB" \
  "optim MB" "sum MB" "peak MB" "formula MB" "sum/form"
for ranks in ${MEMORY_RANKS:-1 2 3 4 8}; do
  for stage in ${MEMORY_STAGES:-0 1 2}; do
    run=run-n$ranks-z$stage
    rm -rf "$run"
    mpirun --oversubscribe -np "$ranks" "$build/hpc_train" --dataset "$dataset" --zero-stage "$stage" \
      --max-steps "${MEMORY_STEPS:-3}" --log-every 1000 --threads-per-rank 1 --progress lines \
      --run-dir "$run" "$@" > "$run.log" 2>&1 || { echo "hpc_train failed: $run"; tail -5 "$run.log"; exit 1; }
    python3 - "$run/summary.json" "$ranks" "$stage" <<'PY'
import json, sys
summary = json.load(open(sys.argv[1]))
ranks, stage = int(sys.argv[2]), int(sys.argv[3])
psi = summary["parameters"]
sixteen = summary["precision"] in ("fp16", "bf16")
p, g, k = (2, 2, 12) if sixteen else (4, 4, 8)
formula = {0: (p + g + k) * psi, 1: (p + g) * psi + k * psi / ranks,
           2: p * psi + (g + k) * psi / ranks}[stage]
params = summary["parameter_bytes_per_rank"]
grads = summary["gradient_bytes_per_rank"]
optim = summary["optimizer_state_bytes_per_rank"]
peaks = summary.get("peak_allocated_bytes_per_rank") or summary.get("peak_host_rss_bytes_per_rank") or [0]
total = params + grads + optim
mb = 1e6
print(f"{ranks:<5} {stage:<5} {params/mb:10.2f} {grads/mb:10.2f} {optim/mb:10.2f} {total/mb:10.2f} "
      f"{max(peaks)/mb:10.1f} {formula/mb:12.2f} {total/formula:8.3f}")
PY
  done
done

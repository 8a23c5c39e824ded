#!/usr/bin/env bash
# hpc_train on 1..N GPUs of one node against PyTorch DDP, in one run:
#   1. weak scaling: simple_cnn at micro-batch 64 per GPU (the origin's setting) and resnet18 at
#      256 per GPU, bf16, ZeRO-2 (NCCL): samples/s at each N, efficiency = rate_N / (N x rate_1),
#      and DDP's (bench/reference/train_reference.py under torch.distributed.run, NCCL, the same
#      network and batch) beside it;
#   2. the origin's claim: its job (simple_cnn, Fashion-MNIST, 10 epochs, 64 per GPU) on 3 GPUs
#      against 1: wall-time speed-up and final accuracy;
#   3. the bus bandwidth the reducer reaches (resnet18, ZeRO-0 all-reduce, eager steps, so that
#      the host can time the collectives) against a plain NCCL all-reduce of the same bytes
#      (bench/reference/allreduce_bw.py).
#   bench/scaling.sh BUILD_DIR FASHION_MNIST_IDX_DIR [OUT_DIR]
# SCALING_GPUS (default: the GPUs nvidia-smi lists, at most 4), BENCH_STEPS (200 per case),
# SCALING_WHOLE_JOB=0 skips part 2. Keep NCCL_NVLS_ENABLE=0 where NVLink multicast must stay off.
set -euo pipefail
build=$(cd "$1" && pwd); idx=$2; out=${3:-scaling-out}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out" && cd "$out"
steps=${BENCH_STEPS:-200}
listed=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
gpus=${SCALING_GPUS:-$(( listed < 4 ? listed : 4 ))}
[ "$gpus" -ge 1 ] || { echo "scaling.sh: no GPU listed by nvidia-smi" >&2; exit 1; }
[ -f fm.h5 ] || "$build/hpc_train_data" convert fashion-mnist "$idx" fm.h5 > /dev/null
[ -f cifar_synthetic.h5 ] || python3 "$here/make_synthetic_cifar.py" cifar_synthetic.h5 50000

hpc() {  # RANKS RUN_DIR [hpc_train options...]: one hpc_train run, one rank per GPU
  local ranks=$1 run_dir=$2
  shift 2
  mpirun -np "$ranks" --bind-to none "$build/hpc_train" --run-dir "$run_dir" "$@" \
    > "$run_dir.log" 2>&1 || { echo "hpc_train failed: $run_dir"; tail -5 "$run_dir.log"; return 1; }
}
ddp() {  # RANKS OUT_JSON [train_reference.py options...]
  local ranks=$1 json=$2
  shift 2
  python3 -m torch.distributed.run --standalone --nproc_per_node "$ranks" \
    "$here/reference/train_reference.py" "$@" > "$json" 2> "$json.err" ||
    { echo "DDP reference failed: $json"; tail -5 "$json.err"; return 1; }
}

weak_scaling() {  # MODEL DATASET BATCH
  local model=$1 data=$2 batch=$3 n
  for n in $(seq 1 "$gpus"); do
    hpc "$n" "run-$model-$n" --dataset "$data" --model "$model" --micro-batch "$batch" \
      --precision bf16 --zero-stage 2 --augment off --max-steps "$steps" --log-every "$steps"
    ddp "$n" "ddp-$model-$n.json" --dataset "$data" --model "$model" --batch "$batch" \
      --precision bf16 --steps "$steps"
  done
  python3 - "$model" "$batch" "$gpus" <<'PY'
import json, sys
model, batch, gpus = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ours = [json.load(open(f"run-{model}-{n}/summary.json"))["samples_per_s"] for n in range(1, gpus + 1)]
ddp = [json.loads(open(f"ddp-{model}-{n}.json").read())["samples_per_s"] for n in range(1, gpus + 1)]
print(f"weak scaling, {model} at {batch} per GPU, bf16, ZeRO-2")
print(f"{'GPUs':>4} {'hpc samples/s':>14} {'efficiency':>10} {'DDP samples/s':>14} {'efficiency':>10} {'hpc/DDP':>8}")
for n in range(1, gpus + 1):
    print(f"{n:>4} {ours[n-1]:>14.0f} {ours[n-1] / (n * ours[0]):>10.1%} {ddp[n-1]:>14.0f} "
          f"{ddp[n-1] / (n * ddp[0]):>10.1%} {ours[n-1] / ddp[n-1]:>8.2f}")
PY
}
weak_scaling simple_cnn fm.h5 64
weak_scaling resnet18 cifar_synthetic.h5 256

if [ "${SCALING_WHOLE_JOB:-1}" = 1 ] && [ "$gpus" -ge 3 ]; then
  for n in 1 3; do hpc "$n" "run-origin-$n" --dataset fm.h5 --epochs 10 --micro-batch 64; done
  python3 - <<'PY'
import json
one, three = (json.load(open(f"run-origin-{n}/summary.json")) for n in (1, 3))
print(f"origin's job (simple_cnn, 10 epochs, 64 per GPU): 1 GPU {one['wall_s']:.1f} s, "
      f"{100 * one['test_accuracy']:.2f}%; 3 GPUs {three['wall_s']:.1f} s, "
      f"{100 * three['test_accuracy']:.2f}%; speed-up {one['wall_s'] / three['wall_s']:.2f}x (the origin claimed 2.8x)")
PY
fi

for n in $(seq 2 "$gpus"); do
  hpc "$n" "run-busbw-$n" --dataset cifar_synthetic.h5 --model resnet18 --micro-batch 256 \
    --precision bf16 --zero-stage 0 --augment off --cuda-graph off --max-steps 50 --log-every 50
  bytes=$(python3 -c "import json; print(int(json.load(open('run-busbw-$n/summary.json'))['step_breakdown']['comm_bytes_per_step']))")
  python3 -m torch.distributed.run --standalone --nproc_per_node "$n" \
    "$here/reference/allreduce_bw.py" --bytes "$bytes" > "allreduce-$n.json" 2> "allreduce-$n.err" ||
    { echo "all-reduce reference failed"; tail -5 "allreduce-$n.err"; exit 1; }
  python3 - "$n" <<'PY'
import json, sys
n = sys.argv[1]
ours = json.load(open(f"run-busbw-{n}/summary.json"))["step_breakdown"]
plain = json.loads(open(f"allreduce-{n}.json").read())
print(f"busbw at {n} GPUs, {ours['comm_bytes_per_step'] / 1e6:.1f} MB/step: reducer "
      f"{ours['busbw_gb_s']:.1f} GB/s (a lower bound, overlapped with backward), plain NCCL "
      f"all-reduce {plain['busbw_gb_s']:.1f} GB/s")
PY
done

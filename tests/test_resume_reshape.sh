#!/usr/bin/env bash
# Resume at another world size, micro-batch and accumulation (Note [Resume position] in
# checkpoint.h): 4 ranks x 16 x accum 1 stop after step 4 of a 10-step epoch; 2 ranks x 16 x
# accum 2 (the same global batch, 64) continue from that checkpoint. The sample trace
# (HPC_TRAIN_TEST_SAMPLE_TRACE, epoch_batches.h) shows:
#   - the multiset of sample indices over the epoch equals the uninterrupted run's;
#   - every optimizer step after the resume is a whole one: the same 64 samples as the
#     uninterrupted run's step of that number;
# and the final weights agree with the uninterrupted run's to 1e-5 (the sums over ranks and
# micro-steps round differently).
set -euo pipefail
work="$HPC_TRAIN_TEST_WORK"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
check=$HPC_TRAIN_SOURCE_DIR/tests/support/check_safetensors.py
"$HPC_TRAIN_DATA" convert fashion-mnist "${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" \
  slice.h5 --max-train 640 --max-test 40 > /dev/null

common=(--dataset slice.h5 --epochs 1 --micro-batch 16 --lr 0.002 --zero-stage 2
        --checkpoint-epochs off --progress lines --log-every 5)
train() {  # train NP RUN_DIR [options...]
  local np=$1 run_dir=$2
  shift 2
  HPC_TRAIN_TEST_SAMPLE_TRACE="$work/$run_dir.trace" timeout 300 "$MPIEXEC" -np "$np" \
    --oversubscribe "$HPC_TRAIN" "${common[@]}" --run-dir "$run_dir" "$@" > "$run_dir.out" 2>&1 ||
    { echo "run $run_dir failed:"; cat "$run_dir.out"; return 1; }
}

train 4 straight --export-weights straight.safetensors
train 4 stopped --max-steps 4 --checkpoint-every 4
train 2 stopped --resume stopped/checkpoints/step-00000004.h5 --grad-accum 2 \
  --export-weights resumed.safetensors
grep -q "samples into it (saved by 4 rank(s), continuing on 2)" stopped.out

python3 - "$work" <<'PY'
import collections, glob, sys
work = sys.argv[1]
def steps(prefix):
    """{(epoch, step): Counter of sample indices} from every rank's trace."""
    out = collections.defaultdict(collections.Counter)
    for path in glob.glob(f"{work}/{prefix}.trace.*"):
        for line in open(path):
            epoch, step, *indices = map(int, line.split())
            out[(epoch, step)].update(indices)
    return out
straight, stopped = steps("straight"), steps("stopped")
assert sorted(straight) == [(0, s) for s in range(1, 11)], sorted(straight)
assert sorted(stopped) == sorted(straight), sorted(stopped)
total = lambda runs: sum((c for c in runs.values()), collections.Counter())
if total(stopped) != total(straight):
    sys.exit("FAIL: the samples seen over the epoch differ from the uninterrupted run's")
for key in sorted(straight):
    if sum(stopped[key].values()) != 64 or stopped[key] != straight[key]:
        sys.exit(f"FAIL: step {key[1]} saw {sum(stopped[key].values())} samples, not the "
                 "uninterrupted run's 64")
print("sample trace: the same 640 samples, the same 64 per step")
PY
python3 "$check" resumed.safetensors --compare straight.safetensors --quiet --rtol 1e-5 ||
  { echo "FAIL: weights after the reshaped resume differ from the uninterrupted run's"; exit 1; }
echo "reshaped resume passed"

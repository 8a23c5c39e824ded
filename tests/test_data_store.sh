#!/usr/bin/env bash
# --data-store memory trains on what --data-store file trains on (Note [Read-once sample store]
# in data/sample_store.h), with the real binaries, on a Fashion-MNIST slice (250 train samples):
#   1. at 1, 2 and 3 ranks, with gradient accumulation over micro-batches of 7 (every rank's last
#      micro-batch of an epoch is partial, and accumulation carries over the epoch's end), the
#      store's run ends with the file run's weights (byte for byte), losses and sample trace
#      (HPC_TRAIN_TEST_SAMPLE_TRACE); over shards and with --drop-last too; the store is read
#      from an INI file (the run directory's config.ini); summary.json says what it read;
#   2. a store's run checkpointed mid-epoch and resumed with the store ends where the file run
#      ends;
#   3. a share over --data-store-limit-mb ends every rank with exit 2 naming the option; so do
#      --data-store memory with --resident-data on, a negative limit and an unknown store;
#   4. a store's run of 3 ranks checkpointed mid-epoch and resumed with the store on 2 ranks (the
#      same global batch) sees, over the whole run and in every step after the resume, the
#      samples of the uninterrupted run (the sample traces), and ends with its weights to 1e-5.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"

"$HPC_TRAIN_DATA" convert fashion-mnist "${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" \
  slice.h5 --max-train 250 --max-test 61 > /dev/null
mkdir parts
"$HPC_TRAIN_DATA" shard slice.h5 --shards 3 parts/slice > /dev/null

# train NP NAME [options...]: one run over $dataset (slice.h5 unless set) with $accumulation
# (section 4 changes it), its output in NAME.out, its weights in NAME.safetensors, its sample
# trace in NAME.trace.<rank>.
common=(--epochs 2 --micro-batch 7 --lr 0.002 --progress lines --log-every 2
        --checkpoint-epochs off)
accumulation=2
dataset=slice.h5
train() {
  local np=$1 name=$2
  shift 2
  HPC_TRAIN_TEST_SAMPLE_TRACE="$PWD/$name.trace" timeout 300 "$MPIEXEC" -np "$np" --oversubscribe \
    "$HPC_TRAIN" "${common[@]}" --grad-accum "$accumulation" --dataset "$dataset" --run-dir "$name" \
    --export-weights "$name.safetensors" "$@" \
    > "$name.out" 2>&1 || { cat "$name.out"; fail "run $name failed"; }
}
# same NP A B: bitwise equal weights, the same losses (every record's "loss" in metrics.jsonl)
# and every rank's same samples in the same order (the traces).
same() {
  local np=$1 a=$2 b=$3 rank
  cmp "$a.safetensors" "$b.safetensors" || fail "$a and $b end with different weights"
  grep -o '"loss":[^,}]*' "$a/metrics.jsonl" > "$a.losses"
  grep -o '"loss":[^,}]*' "$b/metrics.jsonl" > "$b.losses"
  [ "$(wc -l < "$a.losses")" -ge 4 ] || fail "$a: too few losses in metrics.jsonl"
  diff "$a.losses" "$b.losses" || fail "$a and $b report different losses"
  for ((rank = 0; rank < np; ++rank)); do
    [ -s "$a.trace.$rank" ] || fail "$a: no sample trace of rank $rank"
    cmp "$a.trace.$rank" "$b.trace.$rank" || fail "$a and $b: rank $rank saw other samples"
  done
  echo "same: $a $b ($(wc -l < "$a.losses") losses, $(cat "$a".trace.* | wc -l) micro-batches)"
}

echo "== 1. the store's runs are the file's at 1, 2 and 3 ranks"
for np in 1 2 3; do
  train "$np" "file-$np"
  train "$np" "memory-$np" --data-store memory
  same "$np" "memory-$np" "file-$np"
  grep -qF "Data store: rank 0 read train samples [0, $(((250 + np - 1) / np)))" "memory-$np.out" ||
    fail "memory-$np: no line of what rank 0 read"
done
# Every rank read its share's images once (784 bytes a sample): 84 + 83 + 83 samples.
grep -qF '"read_bytes_per_rank": [' memory-3/summary.json || fail "memory-3/summary.json: no bytes read"
tr -d ' \n' < memory-3/summary.json | grep -qF '"read_bytes_per_rank":[65856,65072,65072]' ||
  fail "memory-3/summary.json: other bytes read: $(cat memory-3/summary.json)"
grep -qF '"exchange_ms_per_step"' memory-3/summary.json || fail "memory-3/summary.json: no exchange time"
grep -qF '"kind": "file"' file-3/summary.json || fail "file-3/summary.json: not a file run"
dataset=parts/slice.shards train 3 memory-shards-3 --data-store memory
same 3 memory-shards-3 file-3
train 2 file-drop-2 --drop-last
train 2 memory-drop-2 --drop-last --data-store memory
same 2 memory-drop-2 file-drop-2
grep -qxF "data_store = memory" memory-2/config.ini || fail "memory-2/config.ini: no data_store"
HPC_TRAIN_TEST_SAMPLE_TRACE="$PWD/ini-2.trace" timeout 300 "$MPIEXEC" -np 2 --oversubscribe \
  "$HPC_TRAIN" --config memory-2/config.ini --run-dir ini-2 --export-weights ini-2.safetensors \
  > ini-2.out 2>&1 || { cat ini-2.out; fail "run ini-2 failed"; }
grep -qF "Data store:" ini-2.out || fail "ini-2: the INI file's data_store was not used"
same 2 ini-2 file-2
# The comparison can tell runs apart: another seed ends elsewhere.
train 2 memory-seed-2 --data-store memory --seed 2
! cmp -s memory-seed-2.safetensors file-2.safetensors || fail "another seed ended with the same weights"

echo "== 2. checkpointed mid-epoch and resumed with the store"
# 84 samples a rank at 3 ranks: 12 micro-batches, 6 steps an epoch; step 4 is mid-epoch.
train 3 checkpointed --data-store memory --checkpoint-every 4 --keep-checkpoints 0
step4=checkpointed/checkpoints/step-00000004.h5
[ -f "$step4" ] || fail "no checkpoint of step 4"
train 3 resumed --data-store memory --resume "$step4"
grep -qF "Resumed from $step4: step 4" resumed.out || fail "resumed: no resume line"
cmp resumed.safetensors file-3.safetensors || fail "resumed with the store ends elsewhere"
# The resumed run's micro-batches are the tail of the uninterrupted run's.
for rank in 0 1 2; do
  tail -n "$(wc -l < "resumed.trace.$rank")" "file-3.trace.$rank" | cmp - "resumed.trace.$rank" ||
    fail "resumed: rank $rank saw other samples than the file run's last ones"
done

echo "== 3. refusals"
"$HPC_TRAIN_DATA" convert fashion-mnist "${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" \
  large.h5 --max-train 3000 --max-test 10 > /dev/null
# 1500 samples a rank need 1.13 MiB (784 image bytes and an 8-byte label each).
expect_failure 2 "--data-store memory: rank 0's share of the train split of large.h5 (1500 samples) needs 1.133 MiB of host memory, more than its limit of 1 MiB (--data-store-limit-mb" \
  timeout 120 "$MPIEXEC" -np 2 --oversubscribe "$HPC_TRAIN" "${common[@]}" --dataset large.h5 \
  --run-dir refused --data-store memory --data-store-limit-mb 1
! grep -qF "Data store: rank 0 read" stdout.txt || fail "the refused store was read"
expect_failure 2 "--data-store memory: cannot be combined with --resident-data on" \
  timeout 120 "$MPIEXEC" -np 2 --oversubscribe "$HPC_TRAIN" "${common[@]}" --dataset slice.h5 --run-dir refused \
  --data-store memory --resident-data on
expect_failure 2 "--data-store-limit-mb -1: must be 0" \
  timeout 120 "$MPIEXEC" -np 1 "$HPC_TRAIN" "${common[@]}" --dataset slice.h5 --run-dir refused --data-store-limit-mb -1
expect_failure 2 "disk" \
  timeout 120 "$MPIEXEC" -np 1 "$HPC_TRAIN" "${common[@]}" --dataset slice.h5 --run-dir refused --data-store disk
grep -qF "file or memory" stderr.txt || fail "--data-store disk: the choices are not named: $(cat stderr.txt)"
echo "== 4. checkpointed on 3 ranks, resumed with the store on 2"
# 252 train samples: 84 a rank on 3, 126 on 2, so that neither pads an epoch and the whole run
# sees every sample twice. Global batch 42: 3 x 7 x accumulation 2, then 2 x 7 x 3; 6 steps an
# epoch, 12 in the run; the resume is at step 4, mid-epoch.
"$HPC_TRAIN_DATA" convert fashion-mnist "${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" \
  even.h5 --max-train 252 --max-test 10 > /dev/null
dataset=even.h5
train 3 straight-3 --data-store memory
train 3 stopped-3 --data-store memory --max-steps 4 --checkpoint-every 4
accumulation=3
train 2 reshaped-2 --data-store memory --resume stopped-3/checkpoints/step-00000004.h5
grep -qF "saved by 3 rank(s), continuing on 2" reshaped-2.out || fail "reshaped-2: no line of the new world size"
grep -qF "Data store: rank 0 read" reshaped-2.out || fail "reshaped-2: the store was not read"
python3 - "$PWD" <<'PY' || fail "the reshaped resume saw other samples than the uninterrupted run"
import collections, glob, sys
work = sys.argv[1]
def steps(name, last_step=None):
    """{step: Counter of sample indices} from every rank's trace (a line: epoch step indices...)."""
    out = collections.defaultdict(collections.Counter)
    for path in glob.glob(f"{work}/{name}.trace.*"):
        for line in open(path):
            epoch, step, *indices = map(int, line.split())
            if last_step is None or step <= last_step:
                out[step].update(indices)
    return out
straight = steps("straight-3")
resumed = steps("stopped-3", 4)
for step, samples in steps("reshaped-2").items():
    if step <= 4:
        sys.exit(f"the resumed run traced step {step}, before its checkpoint")
    resumed[step] = samples
total = lambda runs: sum(runs.values(), collections.Counter())
assert sorted(straight) == list(range(1, 13)), sorted(straight)
if total(straight) != collections.Counter({i: 2 for i in range(252)}):
    sys.exit("the uninterrupted run did not see every sample twice")
if sorted(resumed) != sorted(straight) or total(resumed) != total(straight):
    sys.exit("the samples seen over the run differ from the uninterrupted run's")
for step in straight:
    if resumed[step] != straight[step]:
        sys.exit(f"step {step} saw other samples than the uninterrupted run's")
print("sample trace: every sample twice, each step's 42 those of the uninterrupted run")
PY
python3 "$HPC_TRAIN_SOURCE_DIR/tests/support/check_safetensors.py" reshaped-2.safetensors \
  --compare straight-3.safetensors --quiet --rtol 1e-5 ||
  fail "the reshaped resume with the store ends with other weights than the uninterrupted run"
echo "PASS"

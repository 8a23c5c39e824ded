#!/usr/bin/env bash
# A full disk under the real program, on small tmpfs mounts (root; skipped where mount is refused):
#   1. the monitors' files fill theirs (Note [Monitors never end the run] in
#      include/hpc_train/monitor/metrics.h): metrics.jsonl, the TensorBoard event file and the CSV
#      monitor each warn once, naming the file and the OS error, and stop; the run goes on, exits
#      0, every file ends with a whole record, and the weights are a run's without monitors;
#   2. a checkpoint does not fit (Note [Checkpoint space] in include/hpc_train/io/checkpoint.h),
#      at 1 rank and at 3: an error naming the checkpoint and the OS error, a non-zero exit (not
#      HDF5's signal 11), no temporary file, the earlier checkpoint and `latest` as they were;
#      --resume auto continues from that checkpoint to the weights of the uninterrupted run.
# tests/test_disk_full.cpp does the pieces without a mount.
set -euo pipefail
# Mounts a killed run (CTest's timeout) left behind would keep the work directory from going.
if [[ -n ${HPC_TRAIN_TEST_WORK:-} ]]; then
  while read -r target; do
    umount "$target" 2>/dev/null || true
  done < <(findmnt -rn -o TARGET 2>/dev/null | grep -F "$HPC_TRAIN_TEST_WORK/" | sort -r)
fi
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"
check=$HPC_TRAIN_SOURCE_DIR/tests/support/check_safetensors.py

mounts=()
unmount_all() {
  local target
  for target in "${mounts[@]}"; do umount "$target" 2>/dev/null || umount -l "$target" || true; done
}
trap unmount_all EXIT
# mount_tmpfs DIR SIZE: a tmpfs of SIZE (mount's units: 96k, 2m) at DIR, unmounted at the end.
mount_tmpfs() {
  mkdir -p "$1"
  mount -t tmpfs -o "size=$2" tmpfs "$1" 2>mount.err ||
    skip "cannot mount a tmpfs (root and CAP_SYS_ADMIN needed): $(cat mount.err)"
  mounts+=("$PWD/$1")
}

# 16 KiB, 4 pages: the event file and metrics.jsonl take one each at the first interval, the CSV
# monitor's first two files (one for each tag) the others, and its third finds none; then
# metrics.jsonl and the event file (under 1 KiB an interval each) fill their pages in turn.
mount_tmpfs monitors 16k  # first: skipped before any work where mount is refused

source_dir=${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
"$HPC_TRAIN_DATA" convert fashion-mnist "$source_dir" small.h5 --max-train 240 --max-test 60 \
  > /dev/null
# 240 samples / global batch 8 = 30 steps, a log interval each.
common=(--dataset small.h5 --epochs 1 --log-every 1 --progress lines --checkpoint-epochs off)
# train NP MICRO_BATCH NAME [options...]: one run; its stdout in NAME.out, stderr in NAME.err,
# its exit code in $rc.
train() {
  local np=$1 micro_batch=$2 name=$3
  shift 3
  rc=0
  timeout 200 "$MPIEXEC" -np "$np" --oversubscribe "$HPC_TRAIN" "${common[@]}" \
    --micro-batch "$micro_batch" "$@" > "$name.out" 2> "$name.err" || rc=$?
}
same() {  # same A B: the weights in the two files are bitwise the same
  python3 "$check" "$1" --compare "$2" --quiet || fail "$1 and $2 differ"
}
# warned NAME TEXT: NAME.err has exactly one warning line, which contains TEXT.
warned() {
  local lines
  lines=$(grep -F "warning: cannot write $2" "$1.err" || true)
  [[ $(grep -c . <<<"$lines") == 1 ]] || fail "$1: not one warning for $2: $(cat "$1.err")"
  grep -qF "No space left on device; " <<<"$lines" || fail "$1: no OS error in: $lines"
}

train 1 8 plain --run-dir plain --tensorboard off --export-weights plain.safetensors
[[ $rc == 0 ]] || fail "the run without monitors: exit $rc: $(cat plain.err)"

echo "== 1. the monitors fill their disk"
mkdir -p monitored
# metrics.jsonl lives in the run directory, which also gets config.ini and summary.json (the
# run's result, not monitors): the directory stays on the big disk, its metrics.jsonl on the
# tmpfs.
ln -s "$PWD/monitors/metrics.jsonl" monitored/metrics.jsonl
train 1 8 monitored --run-dir monitored --export-weights monitored.safetensors \
  --tensorboard-output-path monitors --csv-monitor on --csv-monitor-output-path monitors
cat monitored.err
[[ $rc == 0 ]] || fail "exit $rc with full monitor files: $(cat monitored.err)"
grep -q "^Finished: 1 epoch(s), 30 steps" monitored.out || fail "no Finished line"
[[ -s monitored/summary.json ]] || fail "no summary.json"
warned monitored "monitored/metrics.jsonl: "
warned monitored "monitors/tensorboard/events.out.tfevents."
warned monitored "monitors/csv_monitor/"
[[ $(grep -c "warning: cannot" monitored.err) == 3 ]] || fail "more warnings than one a monitor"
same monitored.safetensors plain.safetensors
# The disk filled part way through, and each file ends with its last whole record.
python3 - monitors <<'PY' || fail "a monitor file with a partial record"
import json, pathlib, re, struct, sys
root = pathlib.Path(sys.argv[1])
lines = (root / "metrics.jsonl").read_text().splitlines()
records = [json.loads(line) for line in lines]  # every line whole
train = [r for r in records if r["kind"] == "train"]
assert 0 < len(train) < 30, f"{len(train)} train records: the disk did not fill"
for csv in (root / "csv_monitor").glob("*.csv"):
    rows = csv.read_bytes().split(b"\r\n")
    assert rows[-1] == b"", f"{csv}: ends inside a row"
    assert all(re.fullmatch(rb"step,\w+|\d+,[-+.\w]+", row) for row in rows[:-1]), csv
(events,) = (root / "tensorboard").glob("events.out.tfevents.*")
data, at, count = events.read_bytes(), 0, 0
while at < len(data):
    (length,) = struct.unpack_from("<Q", data, at)
    at += 12 + length + 4
    count += 1
assert at == len(data), f"{events}: ends inside a record"
print(f"{len(train)} train records, {count} TensorBoard records, whole")
PY
plain_train=$(grep -c '"kind":"train"' plain/metrics.jsonl)
[[ $plain_train == 30 ]] || fail "the run without monitors logged $plain_train intervals"

echo "== 2. a checkpoint that does not fit"
# The run writes the checkpoints of steps 10 and 20 into a tmpfs with room for 1.9: the first is
# written, the second refused (the free-space check) and reported at the next checkpoint. Before
# that check HDF5 1.10 ran out of room in the second file's last array, and the job died with
# signal 11. A checkpoint holds the weights 4 times (with the master copy and Adam's moments).
weights_bytes=$(stat -c %s plain.safetensors)
size_kib=$(( weights_bytes * 4 * 19 / 10 / 1024 ))
for np in 1 3; do
  micro_batch=$((np == 1 ? 8 : 2))  # 3 ranks x 2: global batch 6, 40 steps
  disk=checkpoints-np$np
  mount_tmpfs "$disk" "${size_kib}k"
  run=$disk/run
  train "$np" "$micro_batch" "full-np$np" --run-dir "$run" --checkpoint-every 10 \
    --keep-checkpoints 3
  cat "full-np$np.err"
  [[ $rc != 0 ]] || fail "np $np: exit 0 although a checkpoint did not fit"
  [[ $rc != 139 && $rc != 134 ]] || fail "np $np: exit $rc (a crash): $(cat "full-np$np.err")"
  grep -qE "^\[rank [0-9,]+@[^]]+\] error: cannot write checkpoint $run/checkpoints/step-00000020.h5: .*No space left on device" \
    "full-np$np.err" || fail "np $np: no error naming the checkpoint: $(cat "full-np$np.err")"
  ls "$run/checkpoints"
  [[ $(ls "$run/checkpoints") == $'latest\nstep-00000010.h5' ]] ||
    fail "np $np: the checkpoints folder holds $(ls "$run/checkpoints" | tr '\n' ' ')"
  [[ $(cat "$run/checkpoints/latest") == step-00000010.h5 ]] || fail "np $np: latest moved"
done

# The earlier checkpoint reads back and continues the run (1 rank: to the same weights).
train 1 8 resumed --run-dir checkpoints-np1/run --resume auto --checkpoint-every 0 \
  --export-weights resumed.safetensors
[[ $rc == 0 ]] || fail "--resume auto after the full disk: exit $rc: $(cat resumed.err)"
grep -q "Resumed from checkpoints-np1/run/checkpoints/step-00000010.h5: step 10" resumed.out ||
  fail "did not resume from step 10: $(cat resumed.out)"
same resumed.safetensors plain.safetensors
echo "disk full run passed"

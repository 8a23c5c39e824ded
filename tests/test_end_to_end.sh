#!/usr/bin/env bash
# End to end: 3 ranks train simple_cnn on a 2,000-sample slice of the real Fashion-MNIST for
# one epoch and must reach more than 70% test accuracy; the run directory holds the resolved
# configuration, the metrics and the summary.
set -euo pipefail
work="$HPC_TRAIN_TEST_WORK"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
# Debian's dataset-fashion-mnist package; HPC_TRAIN_FASHION_MNIST_DIR points elsewhere.
source_dir=${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
[ -f "$source_dir/train-images-idx3-ubyte.gz" ] || {
  echo "Fashion-MNIST is missing: apt-get install dataset-fashion-mnist"; exit 1; }

"$HPC_TRAIN_DATA" convert fashion-mnist "$source_dir" slice.h5 --max-train 2000 --max-test 2000
timeout 500 "$MPIEXEC" -np 3 --oversubscribe "$HPC_TRAIN" --dataset slice.h5 --epochs 1 \
  --micro-batch 16 --log-every 10 --run-dir run | tee train.out

grep -qE '^Epoch \[1/1\], Step \[10/42\], Loss: [0-9.]+' train.out
# Note [ETA]: every interval line ends with the epoch's and the run's; the last step has none
# left (one epoch: no evaluation time is known yet, so the run's is the epoch's).
step_lines=$(grep -cE '^Epoch \[1/1\], Step \[' train.out)
eta_lines=$(grep -cE '^Epoch \[1/1\], Step \[[0-9]+/42\], Loss: .*; ETA epoch [0-9]+:[0-5][0-9], run [0-9]+:[0-5][0-9]$' train.out)
[ "$step_lines" -eq 5 ] && [ "$eta_lines" -eq 5 ] || {
  echo "ETA: $eta_lines of $step_lines interval lines (5 expected) end with it"; exit 1; }
grep -qE '^Epoch \[1/1\], Step \[42/42\], .*; ETA epoch 0:00, run 0:00$' train.out
for f in config.ini metrics.jsonl summary.json; do [ -s "run/$f" ] || { echo "run/$f missing"; exit 1; }; done
grep -q '^micro_batch = 16' run/config.ini
# Note [Start-up phases]: one line before training, the same phases in summary.json.
grep -qE '^Start-up [0-9.]+ s: loading [0-9.]+ s, mpi [0-9.]+ s, config [0-9.]+ s, placement [0-9.]+ s, dataset [0-9.]+ s, communicator [0-9.]+ s, model [0-9.]+ s, optimizer [0-9.]+ s, data [0-9.]+ s, resume [0-9.]+ s \(rank 0\)$' train.out ||
  { echo "no start-up line"; grep -i start-up train.out; exit 1; }
grep -qE '^Finished: 1 epoch\(s\), 42 steps in [0-9.]+ s \(warm-up [0-9.]+ s\), ' train.out ||
  { echo "no warm-up in the Finished line"; grep Finished train.out; exit 1; }
python3 - <<'PY'
import json
summary = json.load(open("run/summary.json"))
records = [json.loads(line) for line in open("run/metrics.jsonl")]
print("summary:", summary)
assert summary["world_size"] == 3 and summary["model"] == "simple_cnn", summary
assert summary["epochs_completed"] == 1 and summary["steps"] == 42, summary
assert summary["test_samples"] == 2000, summary
assert summary["test_accuracy"] > 0.70, f"test accuracy {summary['test_accuracy']} <= 0.70"
assert summary["samples_per_s"] > 0 and summary["wall_s"] > 0
# The first step, untimed (ThroughputClock), is the warm-up on the CPU.
assert 0 < summary["warmup_s"] < summary["wall_s"], summary
startup = summary["startup"]
phases = ["loading_s", "mpi_s", "config_s", "placement_s", "dataset_s", "communicator_s",
          "model_s", "optimizer_s", "data_s", "resume_s"]
assert sorted(startup) == sorted(phases + ["total_s"]), startup
assert all(startup[p] >= 0 for p in phases), startup
assert abs(sum(startup[p] for p in phases) - startup["total_s"]) < 1e-9, startup
kinds = [r["kind"] for r in records]
assert kinds.count("train") == 5 and kinds.count("epoch") == 1, kinds
# Note [Storage reads per epoch]: per rank, the epoch's and the run's; every rank read its
# third of the 2,000 train images (784 bytes each) through read calls at least.
epoch = next(r for r in records if r["kind"] == "epoch")
for where in (epoch, summary):
    syscall, storage = where["syscall_read_bytes_per_rank"], where["storage_read_bytes_per_rank"]
    assert len(syscall) == 3 and len(storage) == 3, where
    assert all(b is not None and b >= 666 * 784 for b in syscall), syscall
    assert all(b is not None and b >= 0 for b in storage), storage
# Note [ETA]: the steps left in the epoch times the interval's step time.
for r in records:
    if r["kind"] != "train":
        continue
    expected_s = (42 - r["step_in_epoch"]) * r["ms_per_step"] / 1e3
    assert abs(r["eta_epoch_s"] - expected_s) <= 1e-9 * max(1.0, expected_s), (r, expected_s)
    assert r["eta_run_s"] == r["eta_epoch_s"], r
PY
echo "end-to-end passed"

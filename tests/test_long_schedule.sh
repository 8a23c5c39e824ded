#!/usr/bin/env bash
# The learning-rate schedule needs memory independent of the run's length (lr_schedule.h): a
# cosine over --epochs 2000000000 (about 10^11 steps of this dataset) starts and takes its
# first steps with the memory of any other run. (The GPU step once held a table of one double
# per step of the run: 0.8 TB here.) The peak resident memory of the run is checked against 4 GiB.
set -euo pipefail
work="$HPC_TRAIN_TEST_WORK"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$HPC_TRAIN_DATA" convert fashion-mnist "${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" \
  slice.h5 --max-train 640 --max-test 64 > /dev/null
python3 - "$MPIEXEC" "$HPC_TRAIN" <<'PY'
import resource, subprocess, sys
mpiexec, hpc_train = sys.argv[1:]
run = subprocess.run([mpiexec, "-np", "1", hpc_train, "--dataset", "slice.h5", "--micro-batch", "64",
                      "--epochs", "2000000000", "--lr-schedule", "warmup-cosine", "--warmup-steps", "2",
                      "--max-steps", "4", "--log-every", "1", "--run-dir", "long", "--progress", "lines"],
                     capture_output=True, text=True, timeout=120)
if run.returncode != 0:
    sys.exit(f"FAIL: exit {run.returncode}\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
peak_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB
print(f"peak resident memory of the run: {peak_gib:.2f} GiB")
if peak_gib > 4:
    sys.exit(f"FAIL: a schedule of 10^11 steps took {peak_gib:.2f} GiB")
PY
echo "long schedule passed"

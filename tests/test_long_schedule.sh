#!/usr/bin/env bash
# The learning-rate schedule needs memory independent of the run's length (lr_schedule.h): a
# cosine over --epochs 2000000000 (about 10^10 steps of this dataset) starts and takes its first
# steps with the memory of any other run. (The GPU step once held a table of one double per step
# of the run: some 80 GB here, refused at start.) No --max-steps, which would shorten the
# schedule: SIGUSR1 to the rank stops the run after a few steps (exit 75), and the peak
# resident memory of the run is checked against 4 GiB.
set -euo pipefail
work="$HPC_TRAIN_TEST_WORK"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$HPC_TRAIN_DATA" convert fashion-mnist "${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" \
  slice.h5 --max-train 640 --max-test 64 > /dev/null
python3 - "$MPIEXEC" "$HPC_TRAIN" <<'PY'
import json, os, resource, signal, subprocess, sys, time
mpiexec, hpc_train = sys.argv[1:]
with open("run.out", "w") as out:
    run = subprocess.Popen([mpiexec, "-np", "1", hpc_train, "--dataset", "slice.h5",
                            "--micro-batch", "64", "--epochs", "2000000000",
                            "--lr-schedule", "warmup-cosine", "--warmup-steps", "2",
                            "--log-every", "1", "--run-dir", "long", "--progress", "lines"],
                           stdout=out, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    def steps():
        try:
            return max([json.loads(l).get("step", 0) for l in open("long/metrics.jsonl")] or [0])
        except (OSError, ValueError):
            return 0
    while steps() < 3:
        if run.poll() is not None or time.time() > deadline:
            run.kill()
            sys.exit(f"FAIL: the run ended (exit {run.returncode}) or reached no step 3 in 120 s:\n"
                     + open("run.out").read()[-2000:])
        time.sleep(0.1)
    # To the rank itself (mpirun's child): not every Open MPI forwards SIGUSR1 (the GPU
    # machine's did not). It checkpoints and exits 75, and mpirun with it.
    def parent_of(pid):
        try:
            return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return -1  # gone meanwhile
    for child in [int(d) for d in os.listdir("/proc") if d.isdigit()]:
        if parent_of(child) == run.pid:
            os.kill(child, signal.SIGUSR1)
    rc = run.wait(timeout=120)
if rc != 75:
    sys.exit(f"FAIL: exit {rc} after SIGUSR1, want 75:\n" + open("run.out").read()[-2000:])
peak_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB
print(f"peak resident memory of the run: {peak_gib:.2f} GiB")
if peak_gib > 4:
    sys.exit(f"FAIL: a schedule of 10^10 steps took {peak_gib:.2f} GiB")
PY
echo "long schedule passed"

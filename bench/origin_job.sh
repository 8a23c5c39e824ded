#!/usr/bin/env bash
# The origin's job as issue 16 times it: Fashion-MNIST, simple_cnn, 10 epochs, bf16, one rank
# started by mpirun, RUNS times in a row (7 by default). The first run after a build is cold (the
# page cache, CUDA's caches of loaded kernels); the median is the warm runs'. Per run: the
# process's wall time from mpirun's start to its end, the training (summary.json's wall_s, its
# warm-up included and also shown apart), the start-up (summary.json's "startup") and its phases
# in the order they run (rank 0's Start-up line, Note [Start-up phases]), the test accuracy, and
# where an epoch after the first goes (its steps, the rest of its loop, its evaluation;
# metrics.jsonl) and how much of the training fell outside the epochs (checkpoints at epoch ends,
# the run's end). Then the floor under every job: `mpirun -np 1 /bin/true`, three times.
#   bench/origin_job.sh BUILD_DIR FASHION_MNIST_IDX_DIR [OUT_DIR [RUNS [hpc_train options...]]]
# Options after RUNS are added to the job's (--dataset, --epochs, --precision, --log-every and
# --run-dir are its own): e.g. `--max-steps 20` for a quick try on a CPU build.
set -euo pipefail
build=$(cd "$1" && pwd); idx=$(cd "$2" && pwd); out=${3:-origin-job-out}; runs=${4:-7}
shift $(( $# < 4 ? $# : 4 ))
mkdir -p "$out" && cd "$out"
[ -f fm.h5 ] || "$build/hpc_train_data" convert fashion-mnist "$idx" fm.h5 > /dev/null

now_ms() { date +%s%3N; }
for run in $(seq 1 "$runs"); do
  rm -rf "run-$run"
  start_ms=$(now_ms)
  mpirun -np 1 "$build/hpc_train" --dataset fm.h5 --epochs 10 --precision bf16 --log-every 1000 \
    --run-dir "run-$run" "$@" > "run-$run.log" 2>&1 ||
    { echo "hpc_train failed in run $run:"; tail -5 "run-$run.log"; exit 1; }
  echo $(( $(now_ms) - start_ms )) > "run-$run/process_ms"
done
floors=()
for _ in 1 2 3; do
  start_ms=$(now_ms)
  mpirun -np 1 /bin/true
  floors+=($(( $(now_ms) - start_ms )))
done

python3 - "$runs" "${floors[@]}" <<'PY'
import json, statistics, sys
runs, floors = int(sys.argv[1]), [int(ms) / 1e3 for ms in sys.argv[2:]]
walls = []
print(f"{'run':<5} {'process s':>9} {'training s':>10} {'warm-up s':>9} {'start-up s':>10}  "
      f"{'accuracy':>8}  start-up phases")
for run in range(1, runs + 1):
    summary = json.load(open(f"run-{run}/summary.json"))
    process_s = int(open(f"run-{run}/process_ms").read()) / 1e3
    # The phases in the order they run: rank 0's Start-up line (summary.json's keys are sorted).
    startup_line = next((line for line in open(f"run-{run}.log") if line.startswith("Start-up")),
                        "")
    phases = startup_line.partition(": ")[2].strip()
    label = "cold" if run == 1 and runs > 1 else str(run)
    startup_s = summary["startup"]["total_s"]
    print(f"{label:<5} {process_s:9.2f} {summary['wall_s']:10.2f} {summary['warmup_s']:9.2f} "
          f"{startup_s:10.2f}  {100 * summary['test_accuracy']:7.2f}%  {phases}")
    # An epoch after the first (medians): its steps at the run's ms/step, the rest of its
    # training loop (below 0 where the epoch's steps ran faster than the run's mean: steady on a
    # GPU's replayed steps, not on a busy CPU), and the evaluation after it.
    # Outside every epoch: the checkpoints written at epoch ends and the run's end.
    records = [json.loads(line) for line in open(f"run-{run}/metrics.jsonl")]
    all_epochs = [r for r in records if r.get("kind") == "epoch"]
    outside_s = summary["wall_s"] - sum(e["epoch_s"] for e in all_epochs)
    epochs = all_epochs[1:]
    if epochs:
        # An epoch record's "steps" is the run's count at its end.
        steps = statistics.median(e["steps"] - before["steps"]
                                  for before, e in zip(all_epochs, epochs))
        steps_s = steps * summary["ms_per_step"] / 1e3
        train_s = statistics.median(e["epoch_train_s"] for e in epochs)
        evaluation_s = statistics.median(e["epoch_s"] - e["epoch_train_s"] for e in epochs)
        print(f"{'':<5} an epoch after the first: {1e3 * steps_s:.1f} ms of steps "
              f"({summary['ms_per_step']:.4f} ms each), {1e3 * (train_s - steps_s):.1f} ms more "
              f"in its loop, {1e3 * evaluation_s:.1f} ms of evaluation; "
              f"{1e3 * outside_s:.0f} ms of the training outside the epochs")
    if run > 1 or runs == 1:
        walls.append(process_s)
after_cold = " after the cold one" if runs > 1 else ""
print(f"process wall: median {statistics.median(walls):.2f} s of {len(walls)} run(s){after_cold}, "
      f"{sum(w <= 4.0 for w in walls)} within 4 s; mpirun -np 1 /bin/true: "
      + ", ".join(f"{f:.2f}" for f in floors) + " s")
PY

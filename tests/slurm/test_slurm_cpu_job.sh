#!/usr/bin/env bash
# jobscripts/train_cpu.sbatch, unchanged, through the real Slurm of the test cluster (the
# `slurm` fixture: slurm_cluster.sh start/stop). Parameters go through the environment only;
# `sbatch --wait` returns the job's exit code; the job's record (scontrol, the job completion
# log), its output file and its run directory are checked.
set -euo pipefail

# shellcheck source=tests/slurm/job_test_setup.sh
source "$(dirname "$0")/job_test_setup.sh"
slice_dataset 600 200
export HPC_TRAIN HPC_TRAIN_DATASET=$work/slice.h5 HPC_TRAIN_RUN_ROOT=$work/runs
export HPC_TRAIN_ARGS="--epochs 1 --micro-batch 16 --log-every 10"
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

jobscript=$HPC_TRAIN_SOURCE_DIR/jobscripts/train_cpu.sbatch
start_s=$SECONDS
rc=0
timeout 240 sbatch --wait --parsable "$jobscript" > sbatch.out || rc=$?
echo "sbatch --wait returned $rc after $((SECONDS - start_s)) s"
if [ "$rc" -eq 124 ]; then
  squeue || true
  squeue -h -o %i | xargs -r scancel || true
  fail "the job did not finish within 240 s"
fi
job_id=$(head -n 1 sbatch.out | cut -d';' -f1)
[[ "$job_id" =~ ^[0-9]+$ ]] || fail "no job id from sbatch: $(cat sbatch.out)"
output=$work/hpc_train-cpu-$job_id.out
[ -f "$output" ] || fail "the job's output file $output is missing"
echo "---- $output"
cat "$output"
echo "----"
[ "$rc" -eq 0 ] || fail "job $job_id ended with exit code $rc"

# The job's record in the job completion log (there is no slurmdbd for sacct), and in
# slurmctld's memory, where it stays for MinJobAge=16 s or more after the end (sbatch --wait
# polls every 8 s); should the machine have been too slow for that, the log is the record.
completion=$(grep "^JobId=$job_id " "$slurm_dir/log/jobcomp.log" | tail -n 1) ||
  fail "job $job_id is not in the job completion log"
echo "job completion log: $completion"
for field in JobState=COMPLETED ExitCode=0:0 ProcCnt=3 Name=hpc_train-cpu; do
  [[ " $completion " == *" $field "* ]] || fail "job completion log: expected $field"
done
if record=$(scontrol show job -o "$job_id" 2>/dev/null); then
  echo "scontrol: $record"
  for field in JobState=COMPLETED ExitCode=0:0 NumTasks=3 JobName=hpc_train-cpu; do
    [[ " $record " == *" $field "* ]] || fail "job $job_id: expected $field"
  done
else
  echo "note: job $job_id has already left slurmctld's memory"
fi

# The output: 3 ranks, the step lines, the epoch line, the run directory.
grep -q '^hpc_train 0.1.0: 3 rank(s)' "$output" || fail "not 3 ranks"
grep -qE '^Epoch \[1/1\], Step \[10/13\], Loss: [0-9.]+' "$output" || fail "no step line"
grep -qE '^Epoch \[1/1\] done in [0-9.]+ s: train loss [0-9.]+, test loss [0-9.]+, test accuracy' \
  "$output" || fail "no epoch line"
run_dir=$work/runs/hpc_train-cpu-$job_id
grep -q "^Run directory: $run_dir\$" "$output" || fail "run directory not reported as $run_dir"

for f in config.ini metrics.jsonl summary.json; do
  [ -s "$run_dir/$f" ] || fail "$run_dir/$f missing"
done
grep -q '^micro_batch = 16$' "$run_dir/config.ini" || fail "config.ini: micro_batch"
grep -q "^dataset = $work/slice.h5\$" "$run_dir/config.ini" || fail "config.ini: dataset"
python3 - "$run_dir/summary.json" <<'PY'
import json, sys
summary = json.load(open(sys.argv[1]))
print("summary:", {k: summary[k] for k in ("world_size", "epochs_completed", "steps", "test_accuracy")})
assert summary["world_size"] == 3, summary
assert summary["epochs_completed"] == 1 and summary["steps"] == 13, summary
assert summary["test_samples"] == 200, summary
PY
echo "slurm cpu job passed (job $job_id)"

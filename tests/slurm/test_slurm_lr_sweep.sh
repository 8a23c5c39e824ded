#!/usr/bin/env bash
# jobscripts/train_lr_sweep.sbatch, unchanged, as a job array under the real Slurm of the test
# cluster: two tasks (sbatch --array=0-1 on the command line), learning rates from HPC_TRAIN_LRS,
# 2 steps each. Each task must train with its own learning rate into its own run directory.
set -euo pipefail

# shellcheck source=tests/slurm/job_test_setup.sh
source "$(dirname "$0")/job_test_setup.sh"
slice_dataset 300 100
export HPC_TRAIN HPC_TRAIN_DATASET=$work/slice.h5 HPC_TRAIN_RUN_ROOT=$work/runs
export HPC_TRAIN_ARGS="--epochs 1 --max-steps 2 --micro-batch 16 --log-every 1"
export HPC_TRAIN_LRS="0.0005 0.002"
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

start_s=$SECONDS
rc=0
timeout 240 sbatch --wait --parsable --array=0-1 \
  "$HPC_TRAIN_SOURCE_DIR/jobscripts/train_lr_sweep.sbatch" > sbatch.out || rc=$?
echo "sbatch --wait returned $rc after $((SECONDS - start_s)) s"
if [ "$rc" -eq 124 ]; then
  squeue || true
  squeue -h -o %i | xargs -r scancel || true
  fail "the job array did not finish within 240 s"
fi
job_id=$(head -n 1 sbatch.out | cut -d';' -f1)
[[ "$job_id" =~ ^[0-9]+$ ]] || fail "no job id from sbatch: $(cat sbatch.out)"
for f in hpc_train-lr-sweep-"${job_id}"_*.out; do
  [ -f "$f" ] || continue
  echo "---- $f"
  cat "$f"
done
echo "----"
[ "$rc" -eq 0 ] || fail "job array $job_id: the highest exit code of its tasks is $rc"

lrs=(0.0005 0.002)
for index in 0 1; do
  output=$work/hpc_train-lr-sweep-${job_id}_$index.out
  run_dir=$work/runs/hpc_train-lr-sweep-$job_id/lr-$index-${lrs[$index]}
  [ -f "$output" ] || fail "task $index: output file $output missing"
  task_line=$(grep "^array task $index (job [0-9]*) of job $job_id: " "$output") ||
    fail "task $index: no 'array task' line"
  [[ "$task_line" == *": lr ${lrs[$index]}, run directory $run_dir" ]] ||
    fail "task $index: not the expected learning rate / run directory: $task_line"
  [[ "$task_line" =~ \(job\ ([0-9]+)\) ]] || fail "task $index: no job id in '$task_line'"
  task_job_id=${BASH_REMATCH[1]}
  grep -qE '^Epoch \[1/1\], Step \[2/7\], Loss: [0-9.]+' "$output" || fail "task $index: no step line"
  grep -q "^Run directory: $run_dir\$" "$output" || fail "task $index: run directory not reported"
  [ -s "$run_dir/summary.json" ] || fail "task $index: $run_dir/summary.json missing"
  lr_line=$(grep '^lr = ' "$run_dir/config.ini") || fail "task $index: no lr in config.ini"
  python3 -c "import sys; assert float(sys.argv[1].split('=')[1]) == float(sys.argv[2]), sys.argv" \
    "$lr_line" "${lrs[$index]}" || fail "task $index: config.ini has '$lr_line', not lr ${lrs[$index]}"
  python3 -c "import json, sys; s = json.load(open(sys.argv[1])); assert s['world_size'] == 3 and s['steps'] == 2, s" \
    "$run_dir/summary.json" || fail "task $index: summary.json"
  # Each task is a job of its own (its id in the task's output). The tasks ran one after the
  # other, so the first may have left slurmctld's memory already: the job completion log has it.
  record=$(grep "^JobId=$task_job_id " "$slurm_dir/log/jobcomp.log" | tail -n 1) ||
    fail "task $index (job $task_job_id) is not in the job completion log"
  [[ " $record " == *" JobState=COMPLETED "* && " $record " == *" ExitCode=0:0 "* ]] ||
    fail "task $index: $record"
  echo "task $index (job $task_job_id): lr ${lrs[$index]} in $run_dir, COMPLETED"
done
echo "slurm lr sweep passed (job array $job_id)"

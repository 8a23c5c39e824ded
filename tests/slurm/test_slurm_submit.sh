#!/usr/bin/env bash
# hpc_train_submit through the real Slurm of the test cluster (the `slurm` fixture): one node,
# 3 ranks on its CPUs (--cpu --ntasks-per-node 3: the test node has no GPUs), 600 samples, one
# epoch. The job is polled with scontrol until it ends; then its record, its output in the run
# directory and the run directory's summary.json are checked. Then a second job is preempted
# (USR1 to its batch shell, what --signal=B:USR1@120 sends at the time limit): hpc_train
# checkpoints and exits 75, the script requeues the job, which resumes in the same run
# directory and completes.
set -euo pipefail

# shellcheck source=tests/slurm/job_test_setup.sh
source "$(dirname "$0")/job_test_setup.sh"
submit=${HPC_TRAIN_SUBMIT:?}
slice_dataset 600 200
export HPC_TRAIN
unset HPC_TRAIN_MPIRUN_ARGS
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

"$submit" --nodes 1 --cpu --ntasks-per-node 3 --time 5 --job-name submit-test \
  --run-root "$work/runs" --no-module -- --dataset "$work/slice.h5" --epochs 1 \
  --micro-batch 16 --log-every 10 > submit.out || fail "hpc_train_submit exited with $?"
cat submit.out
job_id=$(sed -n 's/^Submitted job \([0-9]*\):.*/\1/p' submit.out)
[[ "$job_id" =~ ^[0-9]+$ ]] || fail "no job id in the output"
run_dir=$work/runs/submit-test-$job_id
grep -qxF "Run directory: $run_dir" submit.out || fail "run directory not reported as $run_dir"
script=$(ls "$work"/runs/submit-test-*.sbatch) || fail "no batch script in $work/runs"

# Wait for the end: scontrol while slurmctld has the job (MinJobAge=16 s after its end), then
# the job completion log.
state="" start_s=$SECONDS
while [ $((SECONDS - start_s)) -lt 240 ]; do
  if record=$(scontrol show job -o "$job_id" 2>/dev/null); then
    state=$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<< "$record")
  elif grep -q "^JobId=$job_id " "$slurm_dir/log/jobcomp.log" 2>/dev/null; then
    state=gone
  fi
  case $state in PENDING | RUNNING | CONFIGURING | COMPLETING | REQUEUED | "") sleep 1 ;; *) break ;; esac
done
echo "job $job_id: $state after $((SECONDS - start_s)) s"
output=$run_dir/slurm-$job_id.out
if [ -f "$output" ]; then echo "---- $output"; cat "$output"; echo "----"; fi
if [ "$state" = RUNNING ] || [ "$state" = PENDING ]; then
  scancel "$job_id" || true
  fail "job $job_id did not end within 240 s"
fi
completion=$(grep "^JobId=$job_id " "$slurm_dir/log/jobcomp.log" | tail -n 1) ||
  fail "job $job_id is not in the job completion log"
echo "job completion log: $completion"
for field in JobState=COMPLETED ExitCode=0:0 ProcCnt=3 Name=submit-test; do
  [[ " $completion " == *" $field "* ]] || fail "job completion log: expected $field"
done

[ -f "$output" ] || fail "the job's output $output is missing"
grep -q '^hpc_train 0.1.0: 3 rank(s)' "$output" || fail "not 3 ranks"
grep -q "^Run directory: $run_dir\$" "$output" || fail "hpc_train did not use $run_dir"
grep -q "job $job_id: hpc_train exited with 0" "$output" || fail "no end line"
grep -q '^resume = auto$' "$run_dir/config.ini" || fail "config.ini: not --resume auto"
grep -q '^device = cpu$' "$run_dir/config.ini" || fail "config.ini: not --device cpu"
python3 - "$run_dir/summary.json" <<'PY'
import json, sys
summary = json.load(open(sys.argv[1]))
print("summary:", {k: summary.get(k) for k in ("world_size", "epochs_completed", "steps", "test_accuracy")})
assert summary["world_size"] == 3, summary
assert summary["epochs_completed"] == 1 and summary["steps"] == 13, summary
assert summary["test_samples"] == 200, summary
assert 0 < summary["test_accuracy"] <= 1, summary
PY
echo "job $job_id passed (script $script)"

# ---- a preempted job: checkpoint, requeue, resume -------------------------------------------
slice_dataset 240 60 > /dev/null
"$submit" --nodes 1 --cpu --ntasks-per-node 3 --job-name preempted --run-root "$work/runs" \
  --no-module -- --dataset "$work/slice.h5" --epochs 2 --micro-batch 4 --log-every 1 \
  --progress lines > submit.out || fail "hpc_train_submit exited with $?"
job_id=$(sed -n 's/^Submitted job \([0-9]*\):.*/\1/p' submit.out)
[[ "$job_id" =~ ^[0-9]+$ ]] || fail "no job id in the output: $(cat submit.out)"
run_dir=$work/runs/preempted-$job_id
output=$run_dir/slurm-$job_id.out
# Preempt in the middle of the first epoch (20 steps), once the ranks train.
preempt_until_completed "$run_dir"
echo "---- $output"; cat "$output"; echo "----"
[ "$(job_field Restarts)" = 1 ] || fail "job $job_id: Restarts=$(job_field Restarts), expected 1"
[ "$(job_field ExitCode)" = 0:0 ] || fail "job $job_id: ExitCode=$(job_field ExitCode)"
grep -q "job $job_id: USR1 received, asking hpc_train to checkpoint" "$output" || fail "USR1 not forwarded"
grep -q "job $job_id: checkpoint written in $run_dir; requeueing" "$output" || fail "no requeue"
grep -q "job $job_id start 1 " "$output" || fail "no second start"
grep -q "Resumed from $run_dir/checkpoints/step-" "$output" || fail "the second start did not resume"
grep -q "job $job_id: hpc_train exited with 0" "$output" || fail "no successful end"
python3 -c "import json, sys; s = json.load(open(sys.argv[1])); assert s['epochs_completed'] == 2, s" \
  "$run_dir/summary.json" || fail "the resumed job did not complete 2 epochs"
echo "hpc_train_submit under Slurm passed: job $job_id preempted, requeued, resumed"

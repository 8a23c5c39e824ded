#!/usr/bin/env bash
# jobscripts/train_requeue.sbatch, unchanged, under the real Slurm of the test cluster, with a
# stand-in for hpc_train (preemptible_standin.sh: hpc_train's preemption protocol, no training):
# USR1 to the batch shell (as --signal=B:USR1@120 sends it) -> the script forwards it to mpirun
# -> every rank checkpoints and exits 75 -> the script runs `scontrol requeue` -> the job starts
# again with the same id and run directory -> `--resume auto` continues from the checkpoint ->
# every rank ends after exactly 100 steps, and the job is COMPLETED with one restart.
# The test cluster sets AuthInfo cred_expire=10, so a requeued job starts again after ~20 s
# (Slurm's default is ~2 minutes).
set -euo pipefail

# shellcheck source=tests/slurm/job_test_setup.sh
source "$(dirname "$0")/job_test_setup.sh"
export HPC_TRAIN=$HPC_TRAIN_SOURCE_DIR/tests/slurm/preemptible_standin.sh
export HPC_TRAIN_DATASET=$work/unused.h5 HPC_TRAIN_RUN_ROOT=$work/runs HPC_TRAIN_ARGS=""
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

cancel_and_fail() {
  scontrol show job "${job_id:-0}" 2>/dev/null || true
  [ -n "${job_id:-}" ] && scancel "$job_id" 2>/dev/null
  for f in "$work"/*.out; do [ -f "$f" ] && { echo "---- $f"; cat "$f"; }; done
  fail "$@"
}
# field NAME: NAME's value in the job's record.
field() { scontrol show job -o "$job_id" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p"; }

start_s=$SECONDS
job_id=$(sbatch --parsable "$HPC_TRAIN_SOURCE_DIR/jobscripts/train_requeue.sbatch" | cut -d';' -f1)
[[ "$job_id" =~ ^[0-9]+$ ]] || fail "no job id from sbatch: $job_id"
run_dir=$work/runs/hpc_train-requeue-$job_id
output=$work/hpc_train-requeue-$job_id.out

# Preempt once all 3 ranks run.
deadline=$((SECONDS + 60))
until [ -f "$run_dir/starts.0" ] && [ -f "$run_dir/starts.1" ] && [ -f "$run_dir/starts.2" ]; do
  [ $SECONDS -lt $deadline ] || cancel_and_fail "the job's 3 ranks did not start within 60 s"
  sleep 0.2
done
scancel --signal=USR1 --batch "$job_id"
echo "USR1 sent to the batch shell of job $job_id after $((SECONDS - start_s)) s"

# Wait for the end: requeued (PENDING, BeginTime), running again, COMPLETED.
deadline=$((SECONDS + 150))
while :; do
  state=$(field JobState)
  case "$state" in
    COMPLETED) break ;;
    FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE)
      cancel_and_fail "job $job_id ended $state" ;;
  esac
  [ $SECONDS -lt $deadline ] || cancel_and_fail "job $job_id not finished within 150 s of USR1 (state $state)"
  sleep 1
done
echo "job $job_id COMPLETED after $((SECONDS - start_s)) s"
echo "---- $output"
cat "$output"
echo "----"

[ "$(field Restarts)" = 1 ] || fail "job $job_id: Restarts=$(field Restarts), expected 1"
[ "$(field ExitCode)" = 0:0 ] || fail "job $job_id: ExitCode=$(field ExitCode)"
grep -q "job $job_id start 0 " "$output" || fail "no first start in the output"
grep -q "USR1 received, asking hpc_train to checkpoint" "$output" || fail "USR1 not forwarded"
grep -q "job $job_id preempted with a checkpoint in $run_dir: requeueing" "$output" ||
  fail "no requeue after exit 75"
grep -q "job $job_id start 1 " "$output" || fail "no second start in the output"
grep -q "job $job_id hpc_train exited with 0" "$output" || fail "no successful end"
for rank in 0 1 2; do
  [ -f "$run_dir/final.$rank" ] || fail "rank $rank did not finish"
  read -r _ steps _ resumed_from _ starts < "$run_dir/final.$rank"
  echo "rank $rank: $steps steps, resumed from step $resumed_from, $starts starts"
  if [ "$steps" != 100 ] || [ "$starts" != 2 ]; then fail "rank $rank: $(cat "$run_dir/final.$rank")"; fi
  if [ "$resumed_from" -le 0 ] || [ "$resumed_from" -ge 100 ]; then
    fail "rank $rank resumed from step $resumed_from"
  fi
done
echo "slurm requeue passed (job $job_id)"

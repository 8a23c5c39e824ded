#!/usr/bin/env bash
# Preemption under the real Slurm of the test cluster, with the real hpc_train:
# jobscripts/train_requeue.sbatch, unchanged, runs 3 ranks (ZeRO-2, 2 epochs of a Fashion-MNIST
# slice); USR1 to the batch shell (what --signal=B:USR1@120 sends) -> the script forwards it to
# mpirun -> every rank agrees at the next step boundary, writes one checkpoint and exits 75 ->
# the script runs `scontrol requeue` -> the job starts again with the same id and run directory
# -> `--resume auto` continues from the checkpoint -> the job is COMPLETED with one restart, and
# its final weights are bitwise those of the same training run without interruption.
# The test cluster sets AuthInfo cred_expire=10, so a requeued job starts again after ~20 s
# (Slurm's default is ~2 minutes).
set -euo pipefail

# shellcheck source=tests/slurm/job_test_setup.sh
source "$(dirname "$0")/job_test_setup.sh"
slice_dataset 240 60 > /dev/null
training=(--epochs 2 --micro-batch 4 --zero-stage 2 --lr 0.002 --progress lines)
export HPC_TRAIN HPC_TRAIN_DATASET=$work/slice.h5 HPC_TRAIN_RUN_ROOT=$work/runs
export HPC_TRAIN_ARGS="${training[*]} --log-every 1 --export-weights $work/requeued.safetensors"
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

start_s=$SECONDS
job_id=$(sbatch --parsable "$HPC_TRAIN_SOURCE_DIR/jobscripts/train_requeue.sbatch" | cut -d';' -f1)
[[ "$job_id" =~ ^[0-9]+$ ]] || fail "no job id from sbatch: $job_id"
run_dir=$work/runs/hpc_train-requeue-$job_id
output=$work/hpc_train-requeue-$job_id.out

# Preempt in the middle of the first epoch (20 steps per epoch), once the ranks train; then
# requeued (PENDING, BeginTime), running again, COMPLETED.
preempt_until_completed "$run_dir"
echo "job $job_id COMPLETED after $((SECONDS - start_s)) s"
echo "---- $output"
cat "$output"
echo "----"

[ "$(job_field Restarts)" = 1 ] || fail "job $job_id: Restarts=$(job_field Restarts), expected 1"
[ "$(job_field ExitCode)" = 0:0 ] || fail "job $job_id: ExitCode=$(job_field ExitCode)"
grep -q "job $job_id start 0 " "$output" || fail "no first start in the output"
grep -q "USR1 received, asking hpc_train to checkpoint" "$output" || fail "USR1 not forwarded"
grep -q "job $job_id preempted with a checkpoint in $run_dir: requeueing" "$output" ||
  fail "no requeue after exit 75"
grep -q "job $job_id start 1 " "$output" || fail "no second start in the output"
grep -q "job $job_id hpc_train exited with 0" "$output" || fail "no successful end"
grep -q "Stopped by SIGUSR1 after step" "$output" || fail "hpc_train did not stop on USR1"
grep -q "Resumed from $run_dir/checkpoints/step-" "$output" || fail "the second start did not resume"

# The same training without interruption, outside Slurm: the same weights, bit for bit.
"$MPIEXEC" -np 3 --oversubscribe "$HPC_TRAIN" --dataset slice.h5 "${training[@]}" \
  --run-dir straight --export-weights straight.safetensors > straight.out 2>&1 ||
  { cat straight.out; fail "the uninterrupted run failed"; }
python3 "$HPC_TRAIN_SOURCE_DIR/tests/support/check_safetensors.py" requeued.safetensors \
  --compare straight.safetensors --quiet || fail "the requeued job's weights differ"
echo "slurm requeue passed (job $job_id): preempted, requeued, resumed, same weights"

# Sourced by the job tests (tests/slurm/test_*.sh): what every one of them needs before sbatch.
# Skips (exit 77) where Slurm is not installed; joins the test cluster of its fixture; makes an
# empty work directory the current one; clears what would change the allocation
# (oversubscription from the test environment, variables of an enclosing Slurm job).
# Defines what tests/support/script_test.sh does (fail, skip, python_with, ...), slice_dataset
# TRAIN TEST (a Fashion-MNIST slice in slice.h5), job_end_state, and for a job in $job_id whose
# output is $output: job_field, cancel_and_fail and preempt_until_completed.

: "${HPC_TRAIN_TEST_WORK:?}"
# shellcheck source=tests/support/script_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/script_test.sh"
if ! command -v sbatch > /dev/null; then
  echo "Slurm is not installed (apt-get install slurm-wlm munge): skipped"
  exit 77
fi
# The cluster of nodes in network namespaces (netns_cluster.sh; fixture netns_cluster) where
# HPC_TRAIN_CLUSTER_DIR is set, else the one-node cluster (slurm_cluster.sh; fixture slurm).
if [ -n "${HPC_TRAIN_CLUSTER_DIR:-}" ]; then
  cluster_env=$HPC_TRAIN_CLUSTER_DIR/env.sh
  jobcomp_log=$HPC_TRAIN_CLUSTER_DIR/log/jobcomp.log
  [ -f "$cluster_env" ] || fail "no test cluster in $HPC_TRAIN_CLUSTER_DIR (the netns_cluster_start test sets it up)"
else
  slurm_dir=${HPC_TRAIN_SLURM_DIR:?set HPC_TRAIN_SLURM_DIR to the test cluster directory}
  cluster_env=$slurm_dir/env.sh
  jobcomp_log=$slurm_dir/log/jobcomp.log
  [ -f "$cluster_env" ] || fail "no test cluster in $slurm_dir (the slurm_start test sets it up)"
fi
# shellcheck source=/dev/null
source "$cluster_env"

# The job must fit in what Slurm allocates (3 tasks on a node that declares 4 CPUs): no
# oversubscription from the test environment. Nothing from an enclosing Slurm job either.
# sbatch exports the caller's environment (--export=ALL): the parameters, and, as root, Open
# MPI's permission to run as root.
unset OMPI_MCA_rmaps_base_oversubscribe
while read -r name; do [ "$name" = SLURM_CONF ] || unset "$name"; done < <(compgen -e SLURM_)

slice_dataset() {
  local source_dir=${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
  [ -f "$source_dir/train-images-idx3-ubyte.gz" ] ||
    fail "Fashion-MNIST is missing: apt-get install dataset-fashion-mnist"
  "$HPC_TRAIN_DATA" convert fashion-mnist "$source_dir" slice.h5 --max-train "$1" --max-test "$2"
}

# job_end_state JOB: the state the job ended in, from the cluster's job completion log (a job
# that Slurm resized after a node loss has a RESIZING line first); empty while it runs.
job_end_state() {
  sed -n "s/^JobId=$1 .*JobState=\([A-Z_]*\) .*/\1/p" "$jobcomp_log" 2>/dev/null |
    grep -v RESIZING | tail -n 1 || true
}

# job_field NAME: NAME's value in the record of job $job_id (while slurmctld holds it).
job_field() { scontrol show job -o "$job_id" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p"; }

# cancel_and_fail MESSAGE: job $job_id's record and output ($output), the job cancelled, fail.
cancel_and_fail() {
  scontrol show job "${job_id:-0}" 2>/dev/null || true
  [ -n "${job_id:-}" ] && scancel "$job_id" 2>/dev/null
  [ -f "${output:-}" ] && { echo "---- $output"; cat "$output"; }
  fail "$@"
}

# preempt_until_completed RUN_DIR: once job $job_id has trained 6 steps (RUN_DIR/metrics.jsonl),
# USR1 to its batch shell (what --signal=B:USR1@120 sends at the time limit); then until the
# job is COMPLETED (checkpoint, exit 75, requeue, resume), failing on any other end.
preempt_until_completed() {
  local deadline=$((SECONDS + 90)) state
  until grep -q '"step":6,' "$1/metrics.jsonl" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || cancel_and_fail "job $job_id trained no 6 steps within 90 s"
    sleep 0.2
  done
  scancel --signal=USR1 --batch "$job_id"
  echo "USR1 sent to the batch shell of job $job_id"
  deadline=$((SECONDS + 150))
  while :; do
    state=$(job_field JobState)
    case "$state" in
      COMPLETED) break ;;
      FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE)
        cancel_and_fail "job $job_id ended $state" ;;
    esac
    [ $SECONDS -lt $deadline ] ||
      cancel_and_fail "job $job_id not finished within 150 s of USR1 (state $state)"
    sleep 1
  done
}

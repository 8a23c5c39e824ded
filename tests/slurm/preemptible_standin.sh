#!/usr/bin/env bash
# A stand-in for `hpc_train --run-dir DIR --resume auto` that follows hpc_train's preemption
# protocol, for testing jobscripts/train_requeue.sbatch without training anything: 100 "steps" of
# 0.1 s; on SIGUSR1 every rank records its step in DIR, waits until all ranks have done so (as
# hpc_train's ranks agree and checkpoint together) and exits with 75; with --resume auto it
# continues from the recorded step. At the end each rank writes DIR/final.<rank>:
# "steps 100 resumed_from K starts N".
set -uo pipefail
run_dir="" resume="" steps=100
while [ $# -gt 0 ]; do
  case $1 in
    --run-dir) run_dir=$2; shift ;;
    --resume) resume=$2; shift ;;
  esac
  shift
done
[ -n "$run_dir" ] || { echo "stand-in: --run-dir missing" >&2; exit 2; }
rank=${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-0}}
size=${OMPI_COMM_WORLD_SIZE:-1}
mkdir -p "$run_dir"
step=0 resumed_from=0
if [ "$resume" = auto ] && [ -f "$run_dir/checkpoint.$rank" ]; then
  step=$(cat "$run_dir/checkpoint.$rank")
  resumed_from=$step
  echo "rank $rank: resumed from step $step"
fi
rm -f "$run_dir/preempted.$rank"
echo $(( $(cat "$run_dir/starts.$rank" 2>/dev/null || echo 0) + 1 )) > "$run_dir/starts.$rank"

preempted=0
trap 'preempted=1' USR1
while [ "$step" -lt "$steps" ]; do
  if [ "$preempted" = 1 ]; then
    echo "$step" > "$run_dir/checkpoint.$rank.tmp" && mv "$run_dir/checkpoint.$rank.tmp" "$run_dir/checkpoint.$rank"
    echo "$step" > "$run_dir/preempted.$rank"
    for ((i = 0; i < 100; i++)); do  # all ranks checkpointed, or 10 s
      [ "$(find "$run_dir" -name 'preempted.*' | wc -l)" -ge "$size" ] && break
      sleep 0.1
    done
    echo "rank $rank: preempted at step $step"
    exit 75
  fi
  sleep 0.1
  step=$((step + 1))
done
echo "steps $step resumed_from $resumed_from starts $(cat "$run_dir/starts.$rank")" > "$run_dir/final.$rank"
echo "rank $rank: done, $step steps"

#!/usr/bin/env bash
# Three nodes for real (netns_cluster.sh: network and UTS namespaces, veth links, a slurmd each):
# jobscripts/train_multinode.sbatch, unchanged, as `sbatch --nodes=3 --ntasks-per-node=1`,
# trains to the end with one rank on each node (the log names three hosts), its gradients cross
# the veth links (their byte counters), and its weights are bitwise those of
#   - the same script with HPC_TRAIN_LAUNCHER=srun (srun --mpi=pmix, Slurm's PMIx),
#   - the job that hpc_train_submit --nodes 3 --gpus-per-node 1 writes and submits,
#   - mpirun -H node1,node2,node3 without Slurm (daemons started through the rsh agent),
#   - the same 3 ranks on one node (mpirun -np 3 here),
# all at the same seed, options and --threads-per-rank (CPU kernels round differently at other
# thread counts).
set -euo pipefail

# shellcheck source=tests/slurm/job_test_setup.sh
source "$(dirname "$0")/job_test_setup.sh"
cluster=$HPC_TRAIN_SOURCE_DIR/tests/slurm/netns_cluster.sh
slice_dataset 600 100 > /dev/null
training=(--epochs 1 --micro-batch 20 --zero-stage 2 --lr 0.002 --seed 11 --threads-per-rank 1
          --log-every 5 --progress lines --comm-timeout 120)
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export HPC_TRAIN HPC_TRAIN_DATASET=$work/slice.h5 HPC_TRAIN_RUN_ROOT=$work/runs

# link_bytes: "rx tx" of node1..node3's links, one line each.
link_bytes() { for node in node1 node2 node3; do bash "$cluster" bytes "$node"; done; }

# sbatch_multinode NAME [LAUNCHER]: the job script, waited for; its weights in NAME.safetensors.
sbatch_multinode() {
  local name=$1 job status=0
  job=$(HPC_TRAIN_LAUNCHER=${2:-mpirun} \
        HPC_TRAIN_ARGS="${training[*]} --export-weights $work/$name.safetensors" \
        sbatch --parsable --wait --nodes=3 --ntasks-per-node=1 --cpus-per-task=2 \
        --output="$work/$name-%j.out" "$HPC_TRAIN_SOURCE_DIR/jobscripts/train_multinode.sbatch") ||
    status=$?
  job=${job%%;*}
  echo "---- $name: job $job, exit $status"
  cat "$work/$name-$job.out"
  [ "$status" = 0 ] || fail "the $name job ended with $status"
  grep -q '^Finished: 1 epoch(s)' "$work/$name-$job.out" || fail "$name: no Finished line"
  grep -q '^Nodes: ranks 0 (node node1), 1 (node node2), 2 (node node3)$' "$work/$name-$job.out" ||
    fail "$name: the ranks were not on node1, node2 and node3 (the Nodes line above)"
}

mapfile -t before < <(link_bytes)
sbatch_multinode sbatch
mapfile -t after < <(link_bytes)
# simple_cnn's gradients (6.5 MB) are reduce-scattered and its parameters all-gathered at each of
# the 10 steps: every link carries well over 10 MB each way.
for i in 0 1 2; do
  read -r rx0 tx0 <<< "${before[i]}"
  read -r rx1 tx1 <<< "${after[i]}"
  echo "node$((i + 1)): received $((rx1 - rx0)) B, sent $((tx1 - tx0)) B over its link"
  [ $((rx1 - rx0)) -gt 10000000 ] && [ $((tx1 - tx0)) -gt 10000000 ] ||
    fail "node$((i + 1))'s link carried too little for 10 steps of training"
done

sbatch_multinode srun srun

# The launcher for people who do not write batch scripts: the job it writes and submits.
"$HPC_TRAIN_SUBMIT" --nodes 3 --gpus-per-node 1 --cpus-per-task 2 --time 10 --no-module \
  --job-name submitted --run-root "$work/runs" -- --dataset "$work/slice.h5" "${training[@]}" \
  --export-weights "$work/submitted.safetensors" > submit.out || fail "hpc_train_submit failed"
cat submit.out
job=$(sed -n 's/^Submitted job \([0-9]*\):.*/\1/p' submit.out)
[[ "$job" =~ ^[0-9]+$ ]] || fail "no job id in hpc_train_submit's output"
deadline=$((SECONDS + 240))
until [ -n "$(job_end_state "$job")" ]; do
  [ $SECONDS -lt $deadline ] || { scancel "$job"; fail "the submitted job $job did not end in 240 s"; }
  sleep 1
done
run_dir=$work/runs/submitted-$job
echo "---- $run_dir/slurm-$job.out"
cat "$run_dir/slurm-$job.out"
[ "$(job_end_state "$job")" = COMPLETED ] || fail "the submitted job ended $(job_end_state "$job")"
grep -q '^Nodes: ranks 0 (node node1), 1 (node node2), 2 (node node3)$' "$run_dir/slurm-$job.out" ||
  fail "the submitted job's ranks were not on node1, node2 and node3"
python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); assert s["world_size"] == 3 and s["epochs_completed"] == 1, s; print("submitted job: test accuracy", s["test_accuracy"])' \
  "$run_dir/summary.json" || fail "the submitted job's summary.json"

# Without Slurm: mpirun on node1 starts its daemons on node2 and node3 through the agent
# (ssh on a cluster), and reaches them by their addresses.
on node1 "$MPIEXEC" --mca plm_rsh_agent "$HPC_TRAIN_CLUSTER_RSH" -H node1,node2,node3 -np 3 \
  "$HPC_TRAIN" --dataset "$work/slice.h5" "${training[@]}" --run-dir "$work/runs/hosts" \
  --export-weights "$work/hosts.safetensors" > hosts.out 2>&1 ||
  { cat hosts.out; fail "mpirun -H node1,node2,node3 failed"; }
grep -q '^Nodes: ranks 0 (node node1), 1 (node node2), 2 (node node3)$' hosts.out ||
  { cat hosts.out; fail "mpirun -H: the ranks were not on node1, node2 and node3"; }

# One node: this machine's own namespace, 3 ranks.
"$MPIEXEC" -np 3 --oversubscribe "$HPC_TRAIN" --dataset "$work/slice.h5" "${training[@]}" \
  --run-dir "$work/runs/one-node" --export-weights "$work/one-node.safetensors" > one-node.out 2>&1 ||
  { cat one-node.out; fail "the one-node run failed"; }

for name in srun submitted hosts one-node; do
  python3 "$HPC_TRAIN_SOURCE_DIR/tests/support/check_safetensors.py" sbatch.safetensors \
    --compare "$name.safetensors" --quiet ||
    fail "the weights of the sbatch job and of the $name run differ"
  echo "sbatch job == $name run, bit for bit"
done
echo "three nodes: sbatch (mpirun), srun --mpi=pmix, hpc_train_submit, mpirun -H and one node train the same weights"

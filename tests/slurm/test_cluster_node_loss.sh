#!/usr/bin/env bash
# A node lost in the middle of a run, on the three-node cluster (netns_cluster.sh), and training
# goes on by itself: jobscripts/train_elastic.sbatch (sbatch --no-kill, hpc_train_elastic) on
# node1..node3, one rank each, and at step 15 node3
#   kill: every process of node3 (slurmd included) gets SIGKILL; its connections close;
#   cut:  node3's link goes down; its processes live on, hung, unreachable.
# Then, for each: the job's first attempt ends within --comm-timeout plus a few seconds, naming
# the lost rank and host (the cut: every survivor's watchdog, Note [Naming a lost peer]); the
# supervisor restarts hpc_train on node1 and node2 from the newest checkpoint at world size 2;
# the steps trained again are at most --checkpoint-every; the job completes with the test
# accuracy of an uninterrupted run within 0.5 points; the run directory holds one history
# (metrics.jsonl's resume record, TensorBoard's SessionLog START, read back as TensorBoard
# merges them). The global batch stays 60 at either world size (DeepSpeed's train_batch_size),
# so the restarted run sees the same batches as the uninterrupted one. Node3 comes back after
# each (slurmd started again).
set -euo pipefail

# shellcheck source=tests/slurm/job_test_setup.sh
source "$(dirname "$0")/job_test_setup.sh"
cluster=$HPC_TRAIN_SOURCE_DIR/tests/slurm/netns_cluster.sh
python_protobuf=$(python_with google.protobuf) ||
  skip "no python3 with protobuf (apt-get install python3-protobuf) to read TensorBoard's files"
slice_dataset 3000 1000 > /dev/null
echo '{"train_batch_size": 60, "gradient_accumulation_steps": 1}' > ds.json
checkpoint_every=10
comm_timeout_s=10
training=(--deepspeed-config "$work/ds.json" --epochs 3 --lr 0.002 --seed 5 --threads-per-rank 1
          --log-every 1 --progress lines --checkpoint-every "$checkpoint_every"
          --comm-timeout "$comm_timeout_s" --tensorboard)
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export HPC_TRAIN HPC_TRAIN_DATASET=$work/slice.h5 HPC_TRAIN_RUN_ROOT=$work/runs
export HPC_TRAIN_ELASTIC HPC_TRAIN_MIN_NODES=2 HPC_TRAIN_ARGS="${training[*]}"

"$MPIEXEC" -np 3 --oversubscribe "$HPC_TRAIN" --dataset slice.h5 "${training[@]}" \
  --run-dir straight > straight.out 2>&1 || { cat straight.out; fail "the uninterrupted run failed"; }
# summary_field RUN_DIR KEY
summary_field() { python3 -c "import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" \
  "$1/summary.json" "$2"; }
straight_accuracy=$(summary_field straight test_accuracy)
echo "uninterrupted, 3 ranks: test accuracy $straight_accuracy"

# lose ACTION: the elastic job, and node3 lost by ACTION (kill | cut) at step 15.
lose() {
  local action=$1 job run_dir output state loss_s training_again_s=""
  job=$(sbatch --parsable --nodes=3 --ntasks-per-node=1 --cpus-per-task=2 \
        --output="$work/$action-%j.out" "$HPC_TRAIN_SOURCE_DIR/jobscripts/train_elastic.sbatch")
  job=${job%%;*}
  run_dir=$work/runs/hpc_train-elastic-$job
  output=$work/$action-$job.out
  local deadline=$((SECONDS + 120))
  until grep -q '"step":15,' "$run_dir/metrics.jsonl" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || { cat "$output"; fail "$action: no step 15 within 120 s"; }
    sleep 0.1
  done
  bash "$cluster" "$action" node3
  loss_s=$(date +%s.%N)

  # Until the job ends; meanwhile, when training starts again after the restart.
  deadline=$((SECONDS + 240))
  while :; do
    state=$(job_end_state "$job")
    [ -n "$state" ] && break
    if [ -z "$training_again_s" ] &&
       sed -n '/"kind":"resume"/,$p' "$run_dir/metrics.jsonl" | grep -q '"kind":"train"'; then
      training_again_s=$(date +%s.%N)
    fi
    [ $SECONDS -lt $deadline ] || { cat "$output"; fail "$action: job $job not done within 240 s"; }
    sleep 0.1
  done
  echo "---- $output"
  cat "$output"
  echo "----"
  [ "$state" = COMPLETED ] || fail "$action: job $job ended $state"

  python3 - "$run_dir" "$loss_s" "${training_again_s:-0}" "$comm_timeout_s" "$checkpoint_every" \
    "$straight_accuracy" "$action" <<'EOF'
import json, sys
run_dir, loss_s, again_s, timeout_s, every, straight, action = sys.argv[1:]
loss_s, again_s, timeout_s, straight = float(loss_s), float(again_s), float(timeout_s), float(straight)
attempts = [json.loads(line) for line in open(f"{run_dir}/elastic.jsonl")]
assert len(attempts) == 2, attempts
first, second = attempts
assert first["nodes"] == ["node1", "node2", "node3"] and first["ranks"] == 3, first
assert first["lost"] == ["node3"] and first["outcome"] == "restart 1", first
assert second["nodes"] == ["node1", "node2"] and second["ranks"] == 2, second
assert second["outcome"] == "finished" and second["exit_status"] == 0, second
records = [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]
resumes = [r for r in records if r["kind"] == "resume"]
assert len(resumes) == 1, resumes
resume = resumes[0]
assert resume["world_size"] == 2 and resume["checkpoint_world_size"] == 3, resume
assert resume["step"] % int(every) == 0 and resume["step"] >= 10, resume
redone = resume["steps_redone"]
assert redone <= int(every), f"{redone} steps redone, more than --checkpoint-every {every}"
summary = json.load(open(f"{run_dir}/summary.json"))
assert summary["world_size"] == 2 and summary["steps"] == 150, summary
accuracy = summary["test_accuracy"]
assert abs(accuracy - straight) <= 0.005, f"test accuracy {accuracy} against {straight} uninterrupted"
end_s = first["ended_s"] - loss_s
assert end_s <= timeout_s + 15, f"the job's first attempt ended {end_s:.1f} s after the loss"
assert again_s > loss_s, "no training seen after the restart"
print(f"{action}: first attempt ended {end_s:.1f} s after the loss (--comm-timeout {timeout_s:g}), "
      f"training again after {again_s - loss_s:.1f} s; resumed at step {resume['step']}, "
      f"{redone} step(s) redone (--checkpoint-every {every}); "
      f"test accuracy {100 * accuracy:.2f}% against {100 * straight:.2f}% uninterrupted")
EOF
  grep -q "lost: node3 (rank 2); left: node1 node2" "$output" || fail "$action: no line naming the lost node"
  if [ "$action" = cut ]; then
    # The survivors' watchdogs name the rank that went silent, and its host.
    for rank in 0 1; do
      grep -qE "^\[rank $rank@node$((rank + 1))\] comm: .* did not finish within $comm_timeout_s s .*rank 2@node3 does not answer" \
        "$output" || fail "cut: rank $rank's watchdog did not name rank 2@node3"
    done
  fi
  "$python_protobuf" "$HPC_TRAIN_SOURCE_DIR/tests/support/read_tfevents.py" events "$run_dir" \
    "$run_dir/tensorboard" node1 || fail "$action: TensorBoard's history differs from metrics.jsonl's"

  # node3 back: its hung processes (after a cut) end, its slurmd starts again.
  [ "$action" = cut ] && bash "$cluster" kill node3 > /dev/null
  bash "$cluster" revive node3
}

lose kill
lose cut
echo "node loss survived twice: killed and cut off, each time finished on node1 and node2"

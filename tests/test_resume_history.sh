#!/usr/bin/env bash
# A run directory keeps one history across a restart at a smaller world size (Note [Resume
# record] and Note [Resume in TensorBoard] in include/hpc_train/monitor/run_report.h), with the
# real binary on CPU ranks:
#   1. 3 ranks x micro-batch 4 write checkpoints every 3 steps and log every step up to step 8,
#      where the run ends as if its node were lost (no checkpoint at its end): the newest
#      checkpoint is step 6's;
#   2. --resume auto on 2 ranks x micro-batch 6 (the same global batch, 12) to step 14: one
#      "resume" record before the run's first train record (step 6, the checkpoint, world sizes
#      3 and 2, steps_redone = the highest step logged before it - 6 = 2), the resume line
#      saying so, summary.json's resumed_from and steps_redone;
#   3. the TensorBoard folder: the second event file starts with a SessionLog START at step 6's
#      samples seen + 1 (73) naming the checkpoint, and the two files merged as TensorBoard's
#      loader merges them hold exactly metrics.jsonl's history (tests/support/read_tfevents.py);
#   4. hpc_train_report draws one history: steps 1..14 once each, the restart marked in
#      report.json and in its output.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"
python=$(python_with "google.protobuf, matplotlib") ||
  skip "no Python with google.protobuf and matplotlib (apt-get install python3-protobuf python3-matplotlib)"
"$HPC_TRAIN_DATA" convert fashion-mnist "${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" \
  slice.h5 --max-train 240 --max-test 60 > /dev/null

# train NP MICRO_BATCH OUT [options...]: one run into the run directory "run".
train() {
  local np=$1 micro_batch=$2 out=$3
  shift 3
  timeout 300 "$MPIEXEC" -np "$np" --oversubscribe "$HPC_TRAIN" --dataset slice.h5 --epochs 2 \
    --micro-batch "$micro_batch" --zero-stage 2 --lr 0.002 --progress lines --log-every 1 \
    --checkpoint-every 3 --run-dir run "$@" > "$out" 2>&1 || { cat "$out"; fail "run $out failed"; }
}

echo "== 1. 3 ranks to step 8, checkpoints at 3 and 6"
train 3 4 first.out --max-steps 8 --checkpoint-epochs off
[ "$(ls run/checkpoints | tr '\n' ' ')" = "latest step-00000003.h5 step-00000006.h5 " ] ||
  fail "checkpoints $(ls run/checkpoints)"

echo "== 2. --resume auto on 2 ranks to step 14"
train 2 6 second.out --max-steps 14 --resume auto
checkpoint=run/checkpoints/step-00000006.h5
grep -F "Resumed from $checkpoint" second.out
grep -qF "Resumed from $checkpoint: step 6, epoch 1, 72 samples into it (saved by 3 rank(s), continuing on 2); 2 step(s) logged after it are redone" second.out ||
  fail "the resume line"
"$python" - "$checkpoint" <<'PY'
import json, sys
checkpoint = sys.argv[1]
records = [json.loads(line) for line in open("run/metrics.jsonl")]
kinds = [r["kind"] for r in records]
assert kinds.count("resume") == 1, kinds
at = kinds.index("resume")
resume = records[at]
print("resume record:", json.dumps(resume))
# Before it, only the first run's records; the second run's train records all come after it.
before, after = records[:at], records[at + 1:]
logged = max(r["step"] for r in before if r["kind"] == "train")
assert logged == 8, logged
assert [r["step"] for r in after if r["kind"] == "train"] == list(range(7, 15)), after
assert resume["step"] == 6 and resume["checkpoint"] == checkpoint, resume
assert resume["world_size"] == 2 and resume["checkpoint_world_size"] == 3, resume
assert resume["steps_redone"] == logged - resume["step"] == 2, resume
assert isinstance(resume["time"], str) and resume["time"].endswith("Z"), resume
summary = json.load(open("run/summary.json"))
assert summary["resumed_from"] == checkpoint and summary["steps_redone"] == 2, summary
assert summary["world_size"] == 2 and summary["steps"] == 14, summary
PY

echo "== 3. TensorBoard: START at step 6's samples + 1, one history"
[ "$(ls run/tensorboard | wc -l)" -eq 2 ] || fail "event files: $(ls run/tensorboard)"
"$python" "$HPC_TRAIN_SOURCE_DIR/tests/support/read_tfevents.py" events run run/tensorboard | tee events.out
grep -q "START at step 73 (resumed at step 6 on 2 rank(s))" events.out || fail "no START at step 73"

echo "== 4. hpc_train_report: one history, the restart marked"
"$python" "$HPC_TRAIN_REPORT" run | tee report.out
grep -qF "hpc_train_report: resumed at step 6 from $checkpoint on 2 rank(s) (saved by 3), 2 step(s) redone" report.out ||
  fail "the report's output names no restart"
"$python" - <<'PY'
import json
report = json.load(open("run/report.json"))
records = [json.loads(line) for line in open("run/metrics.jsonl")]
loss = {}  # step -> loss of the history: the second run's from step 7 on
for r in records:
    if r["kind"] == "resume":
        loss = {step: value for step, value in loss.items() if step <= r["step"]}
    elif r["kind"] == "train":
        loss[r["step"]] = r["loss"]
assert sorted(loss) == list(range(1, 15)), sorted(loss)
panels = report["panels"]
assert panels["loss"]["train_points"] == 14, panels["loss"]
assert panels["loss"]["last_train_loss"] == loss[14], panels["loss"]
# The first run's epoch record (stopped at step 8) is redone; the second run's stands.
assert panels["loss"]["test_points"] == 1, panels["loss"]
assert [r["step"] for r in report["resumes"]] == [6], report["resumes"]
assert report["resumes"][0]["steps_redone"] == 2, report["resumes"]
page = open("run/report.html").read()
assert "resumed at step 6 from run/checkpoints/step-00000006.h5" in page
PY
echo "resume history passed"

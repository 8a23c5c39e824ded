#!/usr/bin/env bash
# hpc_train_report on a real short CPU run: report.png is a PNG of the tool's size whose panels
# are not blank, report.html embeds it (the same bytes) and lists summary.json and config.ini,
# and report.json's counts and last values are metrics.jsonl's. A run still being written (an
# unfinished last line) is drawn; the records of runs resumed into the same directory are drawn
# as one history; a missing run directory (exit 2), a missing or corrupt metrics.jsonl (exit 3)
# are refused with a message, writing nothing.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"
[ -x "$HPC_TRAIN_REPORT" ] || { echo "$HPC_TRAIN_REPORT: missing or not executable"; exit 1; }
python=$(python_with "matplotlib, PIL") ||
  skip "no Python with matplotlib and PIL (apt-get install python3-matplotlib python3-pil)"
source_dir=${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
"$HPC_TRAIN_DATA" convert fashion-mnist "$source_dir" x.h5 --max-train 1024 --max-test 256 > /dev/null
# 2 ranks x micro-batch 16: 32 steps an epoch, a log line every 5 steps (7 an epoch).
timeout 250 "$MPIEXEC" -np 2 --oversubscribe "$HPC_TRAIN" --dataset x.h5 --epochs 2 \
  --micro-batch 16 --log-every 5 --run-dir run > train.out

"$python" "$HPC_TRAIN_REPORT" run | tee report.out
grep -q "wrote run/report.png" report.out
"$python" - <<'PY'
import base64, json, re, struct, zlib
from PIL import Image, ImageStat

png = open("run/report.png", "rb").read()
assert png[:8] == b"\x89PNG\r\n\x1a\n", "report.png: not a PNG signature"
length, chunk = struct.unpack(">I4s", png[8:16])
assert chunk == b"IHDR" and length == 13, (chunk, length)
width, height = struct.unpack(">II", png[16:24])
assert zlib.crc32(png[12:29]) == struct.unpack(">I", png[29:33])[0], "IHDR CRC"
report = json.load(open("run/report.json"))
assert (width, height) == (960, 1200) == (report["image"]["width"], report["image"]["height"]), \
    (width, height, report["image"])
print(f"report.png: {width} x {height}, {len(png)} bytes")

# Not blank: each of the 4 x 2 panels' cells has ink (grey-level variance), the plotted ones
# more than the CPU run's "no GPU" ones.
image = Image.open("run/report.png").convert("L")
variances = []
for row in range(4):
    for column in range(2):
        box = (column * width // 2, row * height // 4, (column + 1) * width // 2,
               (row + 1) * height // 4)
        variances.append(ImageStat.Stat(image.crop(box)).var[0])
print("panel variances:", [round(v) for v in variances])
assert all(v > 50 for v in variances), variances

# The HTML: the same PNG embedded, a link to the file, the summary's figures, the configuration.
page = open("run/report.html").read()
assert 'href="report.png"' in page
embedded = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page).group(1)
assert base64.b64decode(embedded) == png, "the embedded image is not report.png"
summary = json.load(open("run/summary.json"))
assert f"<td>test_accuracy</td><td>{json.dumps(summary['test_accuracy'])}</td>" in page
assert "<td>step_breakdown.forward_ms</td>" in page
assert "micro_batch = 16" in page

# What was plotted is metrics.jsonl's.
records = [json.loads(line) for line in open("run/metrics.jsonl")]
train = [r for r in records if r["kind"] == "train"]
epochs = [r for r in records if r["kind"] == "epoch"]
assert len(train) == 14 and len(epochs) == 2, (len(train), len(epochs))
panels = report["panels"]
print("report.json panels:", json.dumps(panels))
assert panels["loss"]["train_points"] == len(train)
assert panels["loss"]["test_points"] == len(epochs)
assert panels["loss"]["last_train_loss"] == train[-1]["loss"]
assert panels["loss"]["last_test_loss"] == epochs[-1]["test_loss"] == summary["test_loss"]
assert panels["test_accuracy"] == {"points": 2, "last": epochs[-1]["test_accuracy"]}
assert panels["samples_per_s"] == {"points": len(train), "last": train[-1]["samples_per_s"]}
assert panels["step_time"]["points"] == len(train)
assert panels["step_time"]["layers"] == ["data wait", "forward", "backward", "comm wait",
                                         "optimizer", "other (untimed)"], panels["step_time"]
assert panels["step_time"]["last_ms_per_step"] == train[-1]["ms_per_step"]
for key in ("gpu_util_pct", "gpu_mem_used_bytes", "gpu_power_w", "gpu_alloc_peak_bytes"):
    assert panels[key] == {"points": 0, "note": "no GPU (CPU run)", "last_max": None}, panels[key]
PY

# A run still going: its last record half written is left out.
mkdir going
cp run/config.ini going/
# Up to the first epoch's record, then part of the next line.
first_epoch_line=$(grep -n '"kind":"epoch"' run/metrics.jsonl | head -n 1 | cut -d: -f1)
{ head -n "$first_epoch_line" run/metrics.jsonl
  sed -n "$((first_epoch_line + 1))p" run/metrics.jsonl | head -c 30; } > going/metrics.jsonl
"$python" "$HPC_TRAIN_REPORT" going 2> going.err
grep -q "leaving out its unfinished last line" going.err
"$python" -c "
import json; r = json.load(open('going/report.json'))
assert r['summary'] is False and r['panels']['loss']['test_points'] == 1, r
assert r['panels']['loss']['train_points'] == 7, r"

# A GPU run's figures (written into a copy of the CPU run's records as a GPU run writes them,
# min and max over the ranks; NVML's null where it measured nothing): plotted, or "not measured".
mkdir gpu nvml-off
"$python" - <<'PY'
import json
records = [json.loads(line) for line in open("run/metrics.jsonl")]
with open("gpu/metrics.jsonl", "w") as gpu, open("nvml-off/metrics.jsonl", "w") as off:
    for i, r in enumerate(records):
        measured, unmeasured = dict(r), dict(r)
        if r["kind"] == "train":
            measured.update({"gpu_util_pct_min": 50 + i, "gpu_util_pct_max": 60 + i,
                             "gpu_mem_used_bytes_min": 1e9, "gpu_mem_used_bytes_max": 2e9 + i,
                             "gpu_power_w_min": 200, "gpu_power_w_max": 300 + i,
                             "gpu_alloc_peak_bytes_min": 5e8, "gpu_alloc_peak_bytes_max": 6e8 + i})
            unmeasured.update({k: None for k in measured if k.startswith("gpu_")})
            unmeasured.update({"gpu_alloc_peak_bytes_min": 5e8, "gpu_alloc_peak_bytes_max": 6e8})
        gpu.write(json.dumps(measured) + "\n")
        off.write(json.dumps(unmeasured) + "\n")
last = max(i for i, r in enumerate(records) if r["kind"] == "train")
open("gpu/last_train_index", "w").write(str(last))
PY
"$python" "$HPC_TRAIN_REPORT" gpu > /dev/null
"$python" "$HPC_TRAIN_REPORT" nvml-off > /dev/null
"$python" - <<'PY'
import json
last = int(open("gpu/last_train_index").read())
panels = json.load(open("gpu/report.json"))["panels"]
expected = {"gpu_util_pct": 60 + last, "gpu_mem_used_bytes": 2e9 + last,
            "gpu_power_w": 300 + last, "gpu_alloc_peak_bytes": 6e8 + last}
for key, last_max in expected.items():
    assert panels[key] == {"points": 14, "note": None, "last_max": last_max}, (key, panels[key])
panels = json.load(open("nvml-off/report.json"))["panels"]
for key in ("gpu_util_pct", "gpu_mem_used_bytes", "gpu_power_w"):
    assert panels[key] == {"points": 0, "note": "not measured", "last_max": None}, panels[key]
assert panels["gpu_alloc_peak_bytes"]["points"] == 14, panels["gpu_alloc_peak_bytes"]
PY

# A run directory that resumed runs wrote into (Note [Resume record]): the first run stopped at
# step 30 by --max-steps (its epoch 1 record at step 30), the second resumed there and ran past
# epoch 1's end to step 42, where its node was lost, the third resumed from step 37's
# checkpoint (step 42 redone). One history: steps up to 30 from the first run, 32 and 37 from the
# second, 42 on from the third; epoch 1 from the second; both restarts named.
mkdir resumed
cp run/config.ini resumed/
"$python" - <<'PY'
import json
records = [json.loads(line) for line in open("run/metrics.jsonl")]
def step_of(r):
    return r["step"] if r["kind"] == "train" else r["steps"]
def segment(first, last, offset):
    out = []
    for r in records:
        if r["kind"] in ("train", "epoch") and first < step_of(r) <= last:
            r = dict(r)
            r["loss" if r["kind"] == "train" else "train_loss"] = (
                r.get("loss", r.get("train_loss")) + offset)
            out.append(r)
    return out
def resume(step, redone):
    return {"kind": "resume", "step": step, "checkpoint": f"resumed/checkpoints/step-{step:08d}.h5",
            "world_size": 1, "checkpoint_world_size": 2, "steps_redone": redone,
            "time": "2026-12-06T12:00:00Z"}
first = segment(0, 30, 0.0)
first.append({**[r for r in records if r["kind"] == "epoch"][0], "complete": False, "steps": 30,
              "samples": 30 * (records[0]["samples"] // records[0]["step"])})
history = first + [resume(30, 0)] + segment(30, 42, 1.0) + [resume(37, 5)] + segment(37, 64, 2.0)
with open("resumed/metrics.jsonl", "w") as f:
    for r in history:
        f.write(json.dumps(r) + "\n")
PY
"$python" "$HPC_TRAIN_REPORT" resumed | tee resumed.out
grep -qF "hpc_train_report: resumed at step 30 from resumed/checkpoints/step-00000030.h5 on 1 rank(s) (saved by 2), 0 step(s) redone" resumed.out
grep -qF "hpc_train_report: resumed at step 37 from resumed/checkpoints/step-00000037.h5 on 1 rank(s) (saved by 2), 5 step(s) redone" resumed.out
"$python" - <<'PY'
import json
report = json.load(open("resumed/report.json"))
records = [json.loads(line) for line in open("run/metrics.jsonl")]
train = [r for r in records if r["kind"] == "train"]
epochs = [r for r in records if r["kind"] == "epoch"]
panels = report["panels"]
# 5, 10, ..., 30 | 32, 37 | 42, ..., 64: each logged step once, as in the uninterrupted run.
assert panels["loss"]["train_points"] == len(train) == 14, panels["loss"]
assert panels["loss"]["last_train_loss"] == train[-1]["loss"] + 2.0, panels["loss"]
assert panels["loss"]["test_points"] == 2, panels["loss"]
assert panels["test_accuracy"] == {"points": 2, "last": epochs[-1]["test_accuracy"]}, panels
assert [(r["step"], r["steps_redone"]) for r in report["resumes"]] == [(30, 0), (37, 5)], report
page = open("resumed/report.html").read()
assert "resumed at step 37 from resumed/checkpoints/step-00000037.h5" in page
PY

# Refusals, each with a message and nothing written.
refuse() {  # expected exit code, message pattern, run directory
  set +e
  "$python" "$HPC_TRAIN_REPORT" "$3" > refused.out 2> refused.err
  local rc=$?
  set -e
  cat refused.err
  [ "$rc" -eq "$1" ] && grep -qE "$2" refused.err || {
    echo "hpc_train_report $3: exit $rc (expected $1), message: $(cat refused.err)"; exit 1; }
  [ ! -e "$3/report.png" ] && [ ! -e "$3/report.html" ] || { echo "$3: a report was written"; exit 1; }
}
refuse 2 "RUN_DIR no-such-run: no such directory" no-such-run
mkdir empty
refuse 3 "empty/metrics.jsonl: missing" empty
mkdir corrupt
{ head -n 1 run/metrics.jsonl; echo '{"kind": "train", "step": 5, "loss": '; tail -n +2 run/metrics.jsonl; } \
  > corrupt/metrics.jsonl
refuse 3 "corrupt/metrics.jsonl:2: not JSON" corrupt
mkdir wrong
sed '1s/"loss":[^,]*/"loss":"high"/' run/metrics.jsonl > wrong/metrics.jsonl
head -n 1 run/metrics.jsonl | grep -q '"kind":"train"' || { echo "run/metrics.jsonl: line 1 is not a train record"; exit 1; }
refuse 3 'wrong/metrics.jsonl:1: "loss" is "high", not a finite number' wrong
mkdir binary
head -c 300 run/report.png > binary/metrics.jsonl
refuse 3 "binary/metrics.jsonl" binary
echo "report passed"

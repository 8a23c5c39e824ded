#!/usr/bin/env bash
# hpc_train evaluate end to end: 2 ranks train simple_cnn for one epoch on a slice of the real
# Fashion-MNIST (a test split of 401 samples, uneven over 3 ranks and over the batches of 64);
# then the checkpoint is evaluated at 1 and 3 ranks, the exported safetensors file at 2 ranks and
# the train split at 3. The figures agree between the rank counts, with the training's summary.json
# (the same weights on the same split), with the saved predictions, and with a torch
# recomputation from the checkpoint's weights (bench/reference/models.py's simple_cnn). Then the
# errors: a missing checkpoint, an unknown split, weights of another model, no weights.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"

source_dir=${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
[ -f "$source_dir/train-images-idx3-ubyte.gz" ] ||
  fail "Fashion-MNIST is missing: apt-get install dataset-fashion-mnist"
python=$(python_with "torch, h5py, numpy, matplotlib, PIL") ||
  skip "no python3 with torch, h5py, numpy, matplotlib and PIL"

"$HPC_TRAIN_DATA" convert fashion-mnist "$source_dir" slice.h5 --max-train 1200 --max-test 401
timeout 300 "$MPIEXEC" -np 2 --oversubscribe "$HPC_TRAIN" --dataset slice.h5 --epochs 1 \
  --micro-batch 16 --eval-batch 64 --run-dir run --export-weights weights.safetensors > train.out
# The epoch line: top-1, top-5, then each of the 10 classes.
grep -qE '^Epoch \[1/1\] done in .*test accuracy [0-9.]+% \([0-9]+/401\), top-5 [0-9.]+%; per class( ([0-9.]+|-)){10} %$' train.out ||
  fail "epoch line without top-5 and per-class accuracy: $(grep '^Epoch \[1/1\] done' train.out)"

evaluate() {  # RANKS OUT ARGS...
  local ranks=$1 out=$2
  shift 2
  timeout 300 "$MPIEXEC" -np "$ranks" --oversubscribe "$HPC_TRAIN" evaluate "$@" \
    --dataset slice.h5 --eval-batch 64 --out "$out" > "$out.out" ||
    fail "hpc_train evaluate at $ranks rank(s) failed: $(cat "$out.out")"
  grep -qE '^Evaluated .* \(simple_cnn\) on the (test|train) split of slice.h5: [0-9]+ samples, loss [0-9.]+, accuracy [0-9.]+% .*top-5' "$out.out" ||
    fail "no result line: $(cat "$out.out")"
  for f in evaluation.json confusion_matrix.csv predictions.csv; do
    [ -s "$out/$f" ] || fail "$out/$f missing"
  done
  cat "$out.out"
}
evaluate 1 eval1 run                      # the run directory: its newest checkpoint
evaluate 3 eval3 run/checkpoints/         # its checkpoints folder
evaluate 2 eval_safetensors weights.safetensors
evaluate 3 eval_train run --split train

"$python" - "$HPC_TRAIN_SOURCE_DIR/bench/reference" <<'PY'
import csv, glob, json, math, sys
import h5py, numpy as np, torch, torch.nn.functional as F
sys.path.insert(0, sys.argv[1])
import models

summary = json.load(open("run/summary.json"))
one, three, st, train = (json.load(open(f"{d}/evaluation.json"))
                         for d in ("eval1", "eval3", "eval_safetensors", "eval_train"))
def figures(r):
    return {k: r[k] for k in ("samples", "correct", "correct_top5", "class_accuracy",
                              "class_samples", "confusion_matrix")}
print("1 rank: ", {k: one[k] for k in ("loss", "accuracy", "top5_accuracy", "correct")})
print("3 ranks:", {k: three[k] for k in ("loss", "accuracy", "top5_accuracy", "correct")})
print("summary:", {k: summary[k] for k in ("test_loss", "test_accuracy", "test_top5_accuracy")})
assert one["samples"] == 401 and one["world_size"] == 1 and three["world_size"] == 3, (one, three)
assert one["split"] == "test" and train["split"] == "train" and train["samples"] == 1200, train
# Every count exact at any rank count; the loss up to the order of its sums.
for other in (three, st):
    assert figures(other) == figures(one), (figures(other), figures(one))
    assert math.isclose(other["loss"], one["loss"], rel_tol=1e-6), (other["loss"], one["loss"])
# The training's own evaluation of the same weights (2 ranks).
assert summary["test_correct"] == one["correct"] and summary["test_samples"] == 401, summary
assert summary["test_correct_top5"] == one["correct_top5"], summary
assert summary["test_class_accuracy"] == one["class_accuracy"], summary
assert math.isclose(summary["test_loss"], one["loss"], rel_tol=1e-6), summary
matrix = np.array(one["confusion_matrix"])
assert matrix.sum() == 401 and np.trace(matrix) == one["correct"], matrix
assert one["top5_accuracy"] == one["correct_top5"] / 401 and one["correct_top5"] >= one["correct"]
with open("eval1/confusion_matrix.csv") as f:
    rows = list(csv.reader(f))
assert rows[0] == ["label"] + [f"predicted_{c}" for c in range(10)], rows[0]
assert np.array_equal(np.array([[int(v) for v in r[1:]] for r in rows[1:]]), matrix)

# The predictions: every sample once, in order, and the figures from them.
def predictions(d):
    with open(f"{d}/predictions.csv") as f:
        return list(csv.DictReader(f))
p1, p3 = predictions("eval1"), predictions("eval3")
with h5py.File("slice.h5", "r") as data:
    labels = data["test/labels"][:]
    images = data["test/images"][:]
    mean = torch.tensor(np.asarray(data.attrs["mean"]), dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(np.asarray(data.attrs["std"]), dtype=torch.float32).view(1, -1, 1, 1)
assert [int(r["index"]) for r in p1] == list(range(401)), "indices"
assert [int(r["label"]) for r in p1] == labels.tolist(), "labels"
predicted = np.array([int(r["predicted"]) for r in p1])
top5 = np.array([[int(r[f"class_{k}"]) for k in range(1, 6)] for r in p1])
probabilities = np.array([[float(r[f"probability_{k}"]) for k in range(1, 6)] for r in p1])
assert (predicted == labels).sum() == one["correct"]
assert (top5 == labels[:, None]).any(1).sum() == one["correct_top5"]
assert (np.diff(probabilities, axis=1) <= 0).all() and (probabilities.sum(1) <= 1 + 1e-5).all()
for a, b in zip(p1, p3):
    assert {k: a[k] for k in a if not k.startswith("prob")} == {k: b[k] for k in b if not k.startswith("prob")}, (a, b)
    assert all(abs(float(a[k]) - float(b[k])) < 1e-5 for k in a if k.startswith("prob")), (a, b)

# torch 1.13 from the checkpoint's weights (the file the evaluation took: run's newest).
checkpoint = sorted(glob.glob("run/checkpoints/step-*.h5"))[-1]
assert one["weights"] == checkpoint, (one["weights"], checkpoint)
model = models.build("simple_cnn", 1, 28, 28, 10)
with h5py.File(checkpoint, "r") as f:
    state = {name: torch.from_numpy(np.array(f["model"][name])) for name in f["model"]}
model.load_state_dict(state, strict=True)
model.eval()
with torch.no_grad():
    logits = model((torch.from_numpy(images).float() / 255.0 - mean) / std)
    loss = F.cross_entropy(logits, torch.from_numpy(labels).long()).item()
reference_correct = (logits.argmax(1).numpy() == labels).sum()
reference_top5 = (logits.topk(5, 1).indices.numpy() == labels[:, None]).any(1).sum()
print(f"torch: loss {loss:.6f}, correct {reference_correct}, top-5 {reference_top5}")
assert reference_correct == one["correct"] and reference_top5 == one["correct_top5"]
assert math.isclose(loss, one["loss"], rel_tol=1e-5), (loss, one["loss"])
assert np.allclose(torch.softmax(logits, 1).topk(5, 1).values.numpy(), probabilities, atol=1e-5)
PY

# The picture: hpc_train_report on the --out directory.
"$python" "$HPC_TRAIN_REPORT" eval1 | grep -qF "wrote eval1/confusion_matrix.png" ||
  fail "hpc_train_report eval1 wrote no confusion_matrix.png"
"$python" -c 'import sys
from PIL import Image
image = Image.open("eval1/confusion_matrix.png")
assert image.format == "PNG" and min(image.size) >= 400, (image.format, image.size)' ||
  fail "eval1/confusion_matrix.png is not a PNG picture"

# Errors: every rank ends, with the code of training's start-up errors and a message.
expect_failure 3 "missing-run: no such file or directory" \
  timeout 120 "$MPIEXEC" -np 3 --oversubscribe "$HPC_TRAIN" evaluate missing-run --dataset slice.h5 --out e1
expect_failure 2 "--split validation: must be train or test" \
  timeout 120 "$MPIEXEC" -np 3 --oversubscribe "$HPC_TRAIN" evaluate run --split validation --dataset slice.h5
expect_failure 3 "the weights are simple_cnn's, not resnet18's (--model)" \
  timeout 120 "$MPIEXEC" -np 2 --oversubscribe "$HPC_TRAIN" evaluate weights.safetensors --model resnet18 --dataset slice.h5 --out e2
expect_failure 3 "step-00000038.h5: the weights are simple_cnn's, not resnet18's" \
  timeout 120 "$MPIEXEC" -np 2 --oversubscribe "$HPC_TRAIN" evaluate run --model resnet18 --dataset slice.h5 --out e3
mkdir empty-run
expect_failure 3 "no complete checkpoint in empty-run/checkpoints" \
  timeout 120 "$MPIEXEC" -np 2 --oversubscribe "$HPC_TRAIN" evaluate empty-run --dataset slice.h5 --out e4
expect_failure 2 "give the weights to evaluate" "$HPC_TRAIN" evaluate --dataset slice.h5
"$HPC_TRAIN" evaluate --help | grep -q -- "--split" || fail "evaluate --help lacks --split"
echo "hpc_train evaluate: all checks passed"

#!/usr/bin/env bash
# The training recipes against PyTorch 1.13 (Debian's python3-torch), end to end:
#   1. SGD with Nesterov momentum, weight decay and a multistep schedule: the same scripted
#      simple_cnn from the same weights, every step on the whole 30-sample train slice, gives
#      torch.optim.SGD + MultiStepLR's loss trajectory (tests/support/torchscript_models.py
#      train): each of 20 steps within 1e-5 relative, at 1 rank and at 3 ranks under ZeRO-2;
#      the milestones in steps and in epochs (--lr-milestone-epochs; every step is an epoch);
#   2. label smoothing: torch's CrossEntropyLoss(label_smoothing=0.1) with SGD + momentum, the
#      same 1e-5 at 1 and 3 ranks (SGD, whose step is linear in the gradient: Adam's
#      m / sqrt(v) turns the ranks' rounding of near-zero gradients into ~1e-5 differences);
#   3. --no-decay-bias-bn: torch parameter groups, the biases' without weight decay (SGD),
#      the same 1e-5; and the run with decay everywhere is not within it (the option acts);
#   4. --ema-decay against torch.optim.swa_utils.AveragedModel with an EMA avg_fn: the exported
#      EMA (weights.ema.safetensors) within 1e-5 of PyTorch's after 20 steps, at 1 and 3 ranks,
#      and not the weights themselves; summary.json reports the EMA's test loss;
#   5. SGD's momentum buffer, a one-cycle schedule that cycles it and the EMA survive a
#      checkpoint: 6 steps + resume + 6 ends bitwise equal to 12 steps (the weights and their
#      EMA), at 3 ranks under ZeRO-2; AdamW and LARS runs refuse that checkpoint's SGD state;
#   6. LAMB and LARS (Note [Trust ratios]) against their papers' update rules written out in
#      tests/support/layerwise_optimizers.py, the same 1e-5 at 1 and 3 ranks, with buckets small
#      enough that the ranks' partitions split parameters; and not within 1e-3 of AdamW and SGD
#      with the same settings (the ratios act).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"
support=$HPC_TRAIN_SOURCE_DIR/tests/support
idx=${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
python=$(python_with torch) || fail "no python3 with torch: apt-get install python3-torch"
models() { "$python" "$support/torchscript_models.py" "$@"; }
failures=0

"$HPC_TRAIN_DATA" convert fashion-mnist "$idx" slice30.h5 --max-train 30 --max-test 15 > /dev/null
models script simple_cnn simple_cnn.pt --shape 1,28,28 --classes 10 --seed 3 \
  --state-dict init.safetensors

# train NP RUN_DIR [options...]: one run that must succeed, its output in RUN_DIR.out.
train() {
  local np=$1 run_dir=$2
  shift 2
  timeout 300 "$MPIEXEC" -np "$np" --oversubscribe "$HPC_TRAIN" --progress lines \
    --dataset slice30.h5 --model simple_cnn.pt --init-weights init.safetensors \
    --run-dir "$run_dir" "$@" > "$run_dir.out" 2>&1 ||
    { echo "FAIL: run $run_dir failed:"; cat "$run_dir.out"; exit 1; }
}
losses() {  # losses RUN_DIR: the train records' losses, one a line
  "$python" -c 'import json, sys
for line in open(sys.argv[1]):
    record = json.loads(line)
    if record["kind"] == "train": print(repr(record["loss"]))' "$1/metrics.jsonl"
}
# same_trajectory WHAT FILE_A FILE_B RTOL: whether two columns of losses agree step by step.
same_trajectory() {
  "$python" -c 'import sys
a = [float(v) for v in open(sys.argv[2]).read().split()]
b = [float(v) for v in open(sys.argv[3]).read().split()]
if len(a) != len(b) or not a:
    print(f"{sys.argv[1]}: {len(a)} losses against {len(b)}"); sys.exit(1)
d = [abs(x - y) / abs(y) for x, y in zip(a, b)]
print(f"{sys.argv[1]}: {len(a)} steps, {a[0]:.6f} -> {a[-1]:.6f}, largest relative difference {max(d):.3g}")
sys.exit(0 if max(d) <= float(sys.argv[4]) else 1)' "$@"
}

# against_pytorch NAME "HPC_TRAIN OPTIONS" "REFERENCE OPTIONS": 20 steps of PyTorch's reference
# and of hpc_train at 1 rank (micro-batch 30) and 3 ranks under ZeRO-2 (10 each): the same
# whole-slice batch every step, so the trajectories must agree within 1e-5.
against_pytorch() {
  local name=$1 np micro_batch
  read -r -a ours <<< "$2"
  read -r -a theirs <<< "$3"
  models train simple_cnn.pt init.safetensors "$idx" --max-train 30 --steps 20 "${theirs[@]}" \
    > "$name-torch.txt"
  for np in 1 3; do
    micro_batch=$((30 / np))
    train "$np" "$name-$np" --epochs 100 --max-steps 20 --log-every 1 --checkpoint-epochs off \
      --micro-batch "$micro_batch" --zero-stage $((np == 1 ? 0 : 2)) "${ours[@]}" \
      --export-weights "$name-$np.safetensors"
    losses "$name-$np" > "$name-$np.txt"
    same_trajectory "$name, $np rank(s) vs PyTorch" "$name-$np.txt" "$name-torch.txt" 1e-5 ||
      { echo "FAIL: $name at $np rank(s) beyond 1e-5"; failures=$((failures + 1)); }
  done
}

echo "== 1. SGD + Nesterov + multistep against torch.optim.SGD + MultiStepLR"
against_pytorch sgd-nesterov \
  "--optimizer sgd --lr 0.05 --momentum 0.9 --nesterov --weight-decay 5e-4 --lr-schedule multistep --lr-milestones 8,14 --lr-gamma 0.5" \
  "--lr 0.05 --momentum 0.9 --nesterov --weight-decay 5e-4 --milestones 8,14 --gamma 0.5"

# Every step here is an epoch (the whole slice): milestones in epochs are torchvision's
# per-epoch MultiStepLR, the same trajectory.
against_pytorch sgd-nesterov-epochs \
  "--optimizer sgd --lr 0.05 --momentum 0.9 --nesterov --weight-decay 5e-4 --lr-schedule multistep --lr-milestone-epochs 8,14 --lr-gamma 0.5" \
  "--lr 0.05 --momentum 0.9 --nesterov --weight-decay 5e-4 --milestones 8,14 --gamma 0.5"

echo "== 2. label smoothing against CrossEntropyLoss(label_smoothing)"
against_pytorch label-smoothing \
  "--optimizer sgd --lr 0.05 --momentum 0.9 --weight-decay 5e-4 --label-smoothing 0.1" \
  "--lr 0.05 --momentum 0.9 --weight-decay 5e-4 --label-smoothing 0.1"

echo "== 3. --no-decay-bias-bn against a torch parameter group without weight decay"
against_pytorch no-decay-sgd \
  "--optimizer sgd --lr 0.05 --momentum 0.9 --weight-decay 0.01 --no-decay-bias-bn" \
  "--lr 0.05 --momentum 0.9 --weight-decay 0.01 --no-decay-bias-bn"
models train simple_cnn.pt init.safetensors "$idx" --max-train 30 --steps 20 --lr 0.05 \
  --momentum 0.9 --weight-decay 0.01 > decay-everywhere-torch.txt
if same_trajectory "decay everywhere against none on the biases (must differ)" \
    decay-everywhere-torch.txt no-decay-sgd-torch.txt 1e-5; then
  echo "FAIL: decay everywhere is within 1e-5: the check cannot see the option"
  failures=$((failures + 1))
fi

echo "== 4. --ema-decay against AveragedModel with an EMA avg_fn"
against_pytorch ema "--optimizer sgd --lr 0.05 --momentum 0.9 --weight-decay 5e-4 --ema-decay 0.9" \
  "--lr 0.05 --momentum 0.9 --weight-decay 5e-4 --ema-decay 0.9 --ema-out ema-torch.safetensors"
for np in 1 3; do
  "$python" "$support/check_safetensors.py" "ema-$np.ema.safetensors" \
    --compare ema-torch.safetensors --rtol 1e-5 --quiet ||
    { echo "FAIL: the EMA at $np rank(s) differs from AveragedModel's"; failures=$((failures + 1)); }
  if "$python" "$support/check_safetensors.py" "ema-$np.ema.safetensors" \
      --compare "ema-$np.safetensors" --rtol 1e-3 --quiet > /dev/null 2>&1; then
    echo "FAIL: the EMA at $np rank(s) is the weights themselves"; failures=$((failures + 1))
  fi
  "$python" -c 'import json, sys
s = json.load(open(sys.argv[1]))
print("%s rank(s): test loss %.4f, EMA %.4f" % (sys.argv[2], s["test_loss"], s["test_ema_loss"]))' \
    "ema-$np/summary.json" "$np" || { echo "FAIL: no EMA in summary.json"; failures=$((failures + 1)); }
done

echo "== 5. SGD's momentum buffer, a cycled momentum and the EMA resume bitwise"
cycle=(--optimizer sgd --lr 0.05 --lr-schedule one-cycle --cycle-first-steps 4
       --cycle-second-steps 6 --cycle-decay-steps 2 --cycle-decay-lr-rate 0.5 --zero-stage 2
       --micro-batch 10 --epochs 100 --log-every 1 --checkpoint-epochs off --ema-decay 0.8)
train 3 straight "${cycle[@]}" --max-steps 12 --export-weights straight.safetensors
train 3 first-half "${cycle[@]}" --max-steps 6 --checkpoint-every 6
checkpoint=$(ls first-half/checkpoints/*6*.h5 2> /dev/null | head -1)
[ -n "$checkpoint" ] || { echo "FAIL: no checkpoint at step 6"; ls -R first-half; exit 1; }
train 3 second-half "${cycle[@]}" --max-steps 12 --resume "$checkpoint" \
  --export-weights resumed.safetensors
"$python" "$support/check_safetensors.py" resumed.safetensors --compare straight.safetensors \
  --quiet || { echo "FAIL: the resumed run differs from the straight one"; failures=$((failures + 1)); }
"$python" "$support/check_safetensors.py" resumed.ema.safetensors \
  --compare straight.ema.safetensors --quiet ||
  { echo "FAIL: the resumed run's EMA differs from the straight one's"; failures=$((failures + 1)); }
# Its optimizer state is SGD's: an AdamW run (Adam's moments) and a LARS run (a buffer of
# trust-scaled gradients) refuse it before training, naming both.
for other in adamw lars; do
  status=0
  timeout 120 "$MPIEXEC" -np 3 --oversubscribe "$HPC_TRAIN" --progress lines --dataset slice30.h5 \
    --model simple_cnn.pt --init-weights init.safetensors --run-dir "refused-$other" \
    "${cycle[@]:2}" --optimizer "$other" --resume "$checkpoint" > "refused-$other.out" 2>&1 ||
    status=$?
  if [ "$status" -eq 0 ] ||
      ! grep -q "optimizer state is sgd's; this run's --optimizer is $other" "refused-$other.out"; then
    echo "FAIL: resuming SGD's state with $other: exit $status"; cat "refused-$other.out"
    failures=$((failures + 1))
  fi
done
tail -n 6 < <(losses straight) > straight-last.txt
losses second-half | tail -n 6 > resumed-last.txt
cmp -s straight-last.txt resumed-last.txt ||
  { echo "FAIL: the resumed losses differ"; paste straight-last.txt resumed-last.txt; failures=$((failures + 1)); }

echo "== 6. LAMB and LARS against the papers' rules (tests/support/layerwise_optimizers.py)"
# The small buckets split simple_cnn's weights between the 3 ranks' partitions: the trust
# ratios need the whole parameters' norms (Note [Trust ratios]).
small_buckets="--bucket-mb 0.02 --first-bucket-mb 0.005"
against_pytorch lamb "--optimizer lamb --lr 0.01 --weight-decay 0.01 $small_buckets" \
  "--optimizer lamb --lr 0.01 --weight-decay 0.01"
against_pytorch lars \
  "--optimizer lars --lr 0.5 --momentum 0.9 --nesterov --weight-decay 5e-4 --trust-coefficient 0.02 --no-decay-bias-bn $small_buckets" \
  "--optimizer lars --lr 0.5 --momentum 0.9 --nesterov --weight-decay 5e-4 --trust-coefficient 0.02 --no-decay-bias-bn"
# The ratios act: SGD with LARS's settings and AdamW with LAMB's take other paths.
models train simple_cnn.pt init.safetensors "$idx" --max-train 30 --steps 20 --lr 0.5 \
  --momentum 0.9 --nesterov --weight-decay 5e-4 --no-decay-bias-bn > lars-as-sgd-torch.txt
models train simple_cnn.pt init.safetensors "$idx" --max-train 30 --steps 20 --optimizer adamw \
  --lr 0.01 --weight-decay 0.01 > lamb-as-adamw-torch.txt
for pair in "lars-as-sgd lars" "lamb-as-adamw lamb"; do
  read -r without with <<< "$pair"
  if same_trajectory "$without against $with (must differ)" "$without-torch.txt" "$with-torch.txt" 1e-3; then
    echo "FAIL: $with is within 1e-3 of $without: the check cannot see the trust ratios"
    failures=$((failures + 1))
  fi
done

[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all recipe checks passed"

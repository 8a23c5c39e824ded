#!/usr/bin/env bash
# Note [Scaler on resume] on the GPU (where fp16 runs; the CPU LibTorch has no fp16 convolution),
# one rank. An fp16 run with dynamic scaling checkpoints after step 6; a copy of the checkpoint
# has its saved scale edited from 2^10 to 2^3 (h5py). Resumed from each:
#   - bf16, and fp16 with a fixed --loss-scale, must not depend on the saved scaler: the two
#     resumes end bitwise equal, and say in one line that the scaler does not carry over;
#   - fp16 with dynamic scaling continues the saved scaler: each resume ends at its file's scale.
# Deterministic cuDNN, so that equal inputs give equal bits.
set -euo pipefail
work="$HPC_TRAIN_TEST_WORK"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
check=$HPC_TRAIN_SOURCE_DIR/tests/support/check_safetensors.py
"$HPC_TRAIN_DATA" convert fashion-mnist "${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" \
  slice.h5 --max-train 640 --max-test 64 > /dev/null
common=(--dataset slice.h5 --epochs 1 --micro-batch 32 --deterministic --checkpoint-epochs off
        --progress lines --log-every 2 --initial-scale-power 10)
train() {  # train RUN_DIR [options...]
  local run_dir=$1
  shift
  timeout 120 "$MPIEXEC" -np 1 "$HPC_TRAIN" "${common[@]}" --run-dir "$run_dir" "$@" \
    > "$run_dir.out" 2>&1 || { echo "run $run_dir failed:"; cat "$run_dir.out"; return 1; }
}
final_scale() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['loss_scale'])" "$1/summary.json"; }

train saved --precision fp16 --max-steps 6 --checkpoint-every 6
cp saved/checkpoints/step-00000006.h5 edited.h5
python3 - <<'PY'
import h5py
with h5py.File("edited.h5", "r+") as f:
    assert f["loss_scaler"].attrs["dynamic"] == 1 and f["loss_scaler"].attrs["scale"] == 1024.0
    f["loss_scaler"].attrs["scale"] = 8.0
PY
for file in saved/checkpoints/step-00000006.h5 edited.h5; do
  name=$(basename "$file" .h5)
  train "bf16-$name" --precision bf16 --max-steps 10 --resume "$file" --export-weights "bf16-$name.safetensors"
  grep -q "Loss scaling: the checkpoint's (fp16, dynamic, scale .*) does not carry over to this run's (bf16, no scaling)" "bf16-$name.out"
  [ "$(final_scale "bf16-$name")" = 1.0 ] || { echo "FAIL: bf16 resumed with a loss scale"; exit 1; }
  train "fixed-$name" --precision fp16 --loss-scale 128 --max-steps 10 --resume "$file" --export-weights "fixed-$name.safetensors"
  grep -q "does not carry over to this run's (fp16, fixed scale 128)" "fixed-$name.out"
  [ "$(final_scale "fixed-$name")" = 128.0 ] || { echo "FAIL: the fixed scale is not 128"; exit 1; }
  train "dynamic-$name" --precision fp16 --max-steps 8 --resume "$file"
  ! grep -q "Loss scaling:" "dynamic-$name.out" || { echo "FAIL: dynamic -> dynamic did not carry over"; exit 1; }
done
python3 "$check" bf16-edited.safetensors --compare bf16-step-00000006.safetensors --quiet ||
  { echo "FAIL: the bf16 resume depends on the saved fp16 scaler"; exit 1; }
python3 "$check" fixed-edited.safetensors --compare fixed-step-00000006.safetensors --quiet ||
  { echo "FAIL: the fixed-scale resume depends on the saved dynamic scaler"; exit 1; }
[ "$(final_scale dynamic-step-00000006)" = 1024.0 ] && [ "$(final_scale dynamic-edited)" = 8.0 ] ||
  { echo "FAIL: dynamic fp16 did not continue the saved scale ($(final_scale dynamic-step-00000006), $(final_scale dynamic-edited))"; exit 1; }

# bf16 -> fp16: the run starts its own dynamic scaler at 2^10.
train from-bf16 --precision bf16 --max-steps 4 --checkpoint-every 4
train to-fp16 --precision fp16 --max-steps 6 --resume from-bf16/checkpoints/step-00000004.h5
grep -q "the checkpoint's (bf16, no scaling) does not carry over to this run's (fp16, dynamic, scale 1024)" to-fp16.out
echo "scaler resume passed"

#!/usr/bin/env bash
# Note [Random state in checkpoints] on the GPU (one rank): vgg11_bn, whose dropout draws from the
# CUDA generator, on the first 320 Fashion-MNIST images zero-padded to 32x32 (VGG's smallest
# input), 2 epochs of 10 steps, --deterministic, the final weights compared through
# --export-weights with an independent safetensors reader:
#   1. eager steps (--cuda-graph off): resumed from the checkpoint of step 7 (mid-epoch), the
#      run ends bitwise equal to the uninterrupted one (before format version 3 the resumed run
#      drew step 0's dropout masks again);
#   2. graph replays (--cuda-graph on, steps 4-20 replayed): the checkpoint of step 7 holds the
#      CUDA generator state of the eager run's step 7 (replays advance the Philox offset as eager
#      steps do), and the resumed run (eager steps 8-10, replays from 11) ends bitwise equal to
#      the uninterrupted graphed run;
#   3. a version 2 copy of the checkpoint (no /training/cuda_rng_state, edited with h5py) still
#      resumes, as version 2 resumes did: with the CUDA generator as the seed left it, so that it
#      ends elsewhere (were it equal, the test could not tell dropout's state from none).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"
check=$HPC_TRAIN_SOURCE_DIR/tests/support/check_safetensors.py
python=$(python_with "numpy, h5py") || fail "no python3 with numpy and h5py"
"$python" "$HPC_TRAIN_SOURCE_DIR/tests/support/source_datasets.py" padded-idx \
  "${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" slice32.npz \
  --train 320 --test 64 --side 32
"$HPC_TRAIN_DATA" convert npz slice32.npz slice.h5 --num-classes 10 > /dev/null

# 320 samples / micro-batch 32 = 10 steps per epoch; 2 epochs = 20 steps.
common=(--model vgg11_bn --dataset slice.h5 --device cuda --epochs 2 --micro-batch 32
        --deterministic --checkpoint-epochs off --keep-checkpoints 0 --progress lines
        --log-every 5)
train() {  # train RUN_DIR [options...]
  local run_dir=$1
  shift
  timeout 300 "$MPIEXEC" -np 1 "$HPC_TRAIN" "${common[@]}" --run-dir "$run_dir" "$@" \
    > "$run_dir.out" 2>&1 || { cat "$run_dir.out"; fail "run $run_dir failed"; }
}
same() {  # same A B: the weights in the two files are the same bytes (else: by how much not)
  python3 "$check" "$1" --compare "$2" --quiet ||
    { python3 "$check" "$1" --compare "$2" --quiet --rtol 1 || true; fail "$1 differs from $2"; }
}
replays() { python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['graph_replays'])" "$1/summary.json"; }
step7=checkpoints/step-00000007.h5

echo "== 1. eager steps: resumed at step 7"
train eager --cuda-graph off --checkpoint-every 7 --export-weights eager.safetensors
train eager-resumed --cuda-graph off --resume "eager/$step7" --export-weights eager-resumed.safetensors
grep -q "Resumed from eager/$step7: step 7" eager-resumed.out || fail "no resume from step 7"
same eager-resumed.safetensors eager.safetensors

echo "== 2. graph replays: the generator's state after replays, and a resume"
train graphed --cuda-graph on --checkpoint-every 7 --export-weights graphed.safetensors
[ "$(replays graphed)" = 17 ] || fail "graphed: $(replays graphed) graph replays, expected 17"
"$python" - "eager/$step7" "graphed/$step7" <<'PY' || fail "the graphed run's CUDA generator state at step 7 is not the eager run's"
import sys
import h5py
states = [bytes(h5py.File(path, "r")["training/cuda_rng_state"][()]) for path in sys.argv[1:]]
print("CUDA generator state at step 7 (seed, Philox offset): eager %s, graphed %s"
      % (states[0].hex(), states[1].hex()))
sys.exit(0 if len(states[0]) == 16 and states[0] == states[1] else 1)
PY
train graphed-resumed --cuda-graph on --resume "graphed/$step7" \
  --export-weights graphed-resumed.safetensors
[ "$(replays graphed-resumed)" = 10 ] ||
  fail "graphed-resumed: $(replays graphed-resumed) graph replays, expected 10"
same graphed-resumed.safetensors graphed.safetensors
same graphed.safetensors eager.safetensors  # replays compute what eager steps compute

echo "== 3. a version 2 checkpoint resumes without the CUDA generator's state"
cp "eager/$step7" version2.h5
"$python" - <<'PY'
import h5py
import numpy as np
with h5py.File("version2.h5", "r+") as f:
    assert f.attrs["format_version"] == 3
    del f["training/cuda_rng_state"]
    f.attrs["format_version"] = np.int64(2)
PY
train version2-resumed --cuda-graph off --resume version2.h5 \
  --export-weights version2-resumed.safetensors
grep -q "Resumed from version2.h5: step 7" version2-resumed.out || fail "no resume from version2.h5"
! python3 "$check" version2-resumed.safetensors --compare eager.safetensors --quiet 2> /dev/null ||
  fail "the resume from a version 2 file (no CUDA state) ended equal: dropout left no trace"
echo "dropout resume passed"

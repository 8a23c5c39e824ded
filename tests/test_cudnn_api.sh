#!/usr/bin/env bash
# --cudnn-graph-api (Note [cuDNN's legacy API] in run_options.h) reaches LibTorch's convolutions
# (GPU build, one rank on the GPU). cuDNN's own API log (CUDNN_LOGLEVEL_DBG=3) names the
# functions LibTorch called:
#   by default the legacy API's cudnnConvolutionForward, even where the environment asks for the
#     graph API (TORCH_CUDNN_V8_API_DISABLED=0: the option decides);
#   with --cudnn-graph-api on, no legacy convolution call, even where the environment asks for
#     the legacy API (TORCH_CUDNN_V8_API_DISABLED=1);
#   both runs train: exit 0, a finite loss in the summary.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"
"$HPC_TRAIN_DATA" convert fashion-mnist "${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" \
  slice.h5 --max-train 640 --max-test 64 > /dev/null
# run NAME V8_DISABLED [options...]: two steps with cuDNN's API log in NAME.log.
run() {
  local name=$1 disabled=$2
  shift 2
  CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG="$PWD/$name.log" TORCH_CUDNN_V8_API_DISABLED=$disabled \
    "$MPIEXEC" -np 1 "$HPC_TRAIN" --dataset slice.h5 --device cuda --precision bf16 \
    --micro-batch 64 --max-steps 2 --log-every 1 --progress lines --checkpoint-epochs off \
    --run-dir "run-$name" "$@" > "$name.out" 2>&1 || fail "$name: exit $?: $(tail -5 "$name.out")"
  python3 -c "import json, math, sys; s = json.load(open(sys.argv[1])); sys.exit(not math.isfinite(s['final_train_loss']))" \
    "run-$name/summary.json" || fail "$name: no finite final_train_loss in run-$name/summary.json"
}
legacy_calls() { grep -c "function cudnnConvolutionForward()" "$1.log" || true; }

run legacy 0
[[ $(legacy_calls legacy) -gt 0 ]] || fail "default: no cudnnConvolutionForward call in cuDNN's log"
run graph 1 --cudnn-graph-api on
[[ -s graph.log ]] || fail "--cudnn-graph-api on: cuDNN wrote no log"
[[ $(legacy_calls graph) -eq 0 ]] ||
  fail "--cudnn-graph-api on: $(legacy_calls graph) legacy cudnnConvolutionForward calls"
echo "legacy API by default ($(legacy_calls legacy) legacy convolution calls); none with --cudnn-graph-api on"

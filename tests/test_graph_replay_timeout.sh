#!/usr/bin/env bash
# The watchdog watches CUDA-graph replays (Note [Communication watchdog] in comm.h). GPU build,
# one rank on the GPU, --cuda-graph on, --comm-timeout 3, with --backend nccl (an NCCL world of
# one) and --backend none:
#   healthy: replays that finish never end the job (exit 0, replays counted in summary.json);
#   stalled: the test-only fault switch HPC_TRAIN_TEST_STALL_REPLAY_RANK=0 (Note [Test hooks])
#     holds rank 0's first replay up on the GPU for 30 s. The job must end within a few seconds
#     of the timeout, long before the stall would end, with a non-zero exit and one line that
#     names rank 0, the graph replay and the step the fault switch announced.
set -euo pipefail
work="$HPC_TRAIN_TEST_WORK"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
source_dir=${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
[ -f "$source_dir/train-images-idx3-ubyte.gz" ] || {
  echo "Fashion-MNIST is missing: apt-get install dataset-fashion-mnist," \
       "or set HPC_TRAIN_FASHION_MNIST_DIR"
  exit 1; }
"$HPC_TRAIN_DATA" convert fashion-mnist "$source_dir" slice.h5 --max-train 2000 --max-test 500 \
  > /dev/null
failures=0
# From the stall's start (the fault switch prints when) to the end of the job: the 3 s timeout, a
# 0.1 s poll, with NCCL the 5 s grace for ncclCommAbort (kBackendAbortGrace in comm.cpp, which a
# held-up GPU uses up), then MPI_Abort tearing the rank down. The stall itself lasts 30 s.
max_ms=14000

train() {  # train NAME BACKEND: one rank on the GPU, steps replayed from a CUDA graph
  local name=$1 backend=$2
  timeout 120 "$MPIEXEC" -np 1 "$HPC_TRAIN" --dataset slice.h5 --device cuda --backend "$backend" \
    --cuda-graph on --comm-timeout 3 --epochs 1 --micro-batch 16 --log-every 25 \
    --run-dir "run-$name" > "$name.out" 2> "$name.err"
}

for backend in nccl none; do
  name=healthy-$backend
  if train "$name" "$backend" && python3 -c \
       'import json, sys; sys.exit(json.load(open(sys.argv[1]))["graph_replays"] < 100)' \
       "run-$name/summary.json"; then
    echo "ok   $name: exit 0, $(grep -o '"graph_replays": [0-9]*' "run-$name/summary.json")"
  else
    echo "FAIL $name: want exit 0 and at least 100 graph replays; stdout and stderr:"
    cat "$name.out" "$name.err"
    failures=$((failures + 1))
  fi

  name=stalled-$backend
  set +e
  HPC_TRAIN_TEST_STALL_REPLAY_RANK=0 train "$name" "$backend"
  rc=$?
  set -e
  end_ms=$(date +%s%3N)
  stall_ms=$(sed -n 's/.*stall begins at \([0-9]*\) ms$/\1/p' "$name.err" | head -n 1)
  step=$(sed -n 's/.*graph replay of \(step [0-9]*\) held up.*/\1/p' "$name.err" | head -n 1)
  elapsed_ms=$(( end_ms - ${stall_ms:-0} ))
  want="^\[rank 0@[^]]+\] comm: graph replay of $step did not finish within 3 s"
  want="$want \(backend $backend\)$"
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ -z "$stall_ms" ] || [ -z "$step" ] ||
     [ "$elapsed_ms" -gt "$max_ms" ] || ! grep -qE "$want" "$name.err"; then
    echo "FAIL $name: exit $rc (want non-zero, not 124), ${elapsed_ms} ms after the stall began" \
         "(want <= ${max_ms}), a line matching '$want'; stdout and stderr:"
    cat "$name.out" "$name.err"
    failures=$((failures + 1))
  else
    echo "ok   $name: exit $rc, ${elapsed_ms} ms after the stall began:" \
         "$(grep -E "$want" "$name.err")"
  fi
done

[ "$failures" -eq 0 ] && echo "graph replays are watched" ||
  { echo "$failures case(s) failed"; exit 1; }

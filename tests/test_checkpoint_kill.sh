#!/usr/bin/env bash
# SIGKILL at any moment of a checkpoint write leaves the earlier checkpoints as they were.
# checkpoint_writer writes 53 MB checkpoints in a loop (simple_cnn for 3x40x40 images: 3.3 M
# parameters, their fp32 master copy and two moments), pruning to the newest 2, and is killed at
# several moments of a write (and once between two). After each kill, the checkpoint
# find_latest_checkpoint returns must be the newest one a writer finished (or the one it was
# writing, when the kill came after the rename) and must hold exactly what its step wrote. The
# next writer continues from it, as a resumed run would, and prunes the temporary file left.
set -euo pipefail

writer=${CHECKPOINT_WRITER:?set CHECKPOINT_WRITER to the checkpoint_writer executable}
mpiexec=${MPIEXEC:-mpirun}
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"

# wait_for_lines FILE PATTERN COUNT: until FILE has COUNT lines matching PATTERN (20 s at most).
wait_for_lines() {
  local file=$1 pattern=$2 count=$3 deadline=$((SECONDS + 20))
  until [[ $(grep -c -- "$pattern" "$file" 2>/dev/null) -ge $count ]]; do
    ((SECONDS < deadline)) || fail "$file: fewer than $count '$pattern' lines after 20 s: $(cat "$file")"
    sleep 0.01
  done
}

# A writer still running when the script stops (a failed check) must not write on forever.
pid=
launcher=
stop_writer() {
  [[ -n $pid ]] && kill -KILL "$pid" 2>/dev/null
  [[ -n $launcher ]] && kill -TERM "$launcher" 2>/dev/null
  return 0
}
trap stop_writer EXIT

# Seconds into a round's second write at which the writer is killed; "between" kills it right
# after that write returned, while it prunes. A write takes about half a second here.
moments=(0 0.02 0.05 0.1 0.2 0.35 between)
interrupted=0
launchers=()
for round in "${!moments[@]}"; do
  moment=${moments[round]}
  out=round$round.out
  pid=
  "$mpiexec" -np 1 "$writer" write run 3x40x40 2 >"$out" 2>"round$round.err" &
  launcher=$!
  wait_for_lines "$out" '^pid ' 1
  pid=$(awk '/^pid /{print $2; exit}' "$out")
  wait_for_lines "$out" '^wrote step' 1
  if [[ $moment == between ]]; then
    wait_for_lines "$out" '^wrote step' 2
  else
    wait_for_lines "$out" '^writing step' 2
    sleep "$moment"
  fi
  kill -KILL "$pid"
  # Until the process has exited (a zombie until mpirun reaps it): no write of it is in flight.
  while state=$(ps -o stat= -p "$pid") && [[ $state != Z* ]]; do sleep 0.01; done
  # mpirun takes 2 s to report the killed process: collect it at the end, not here.
  launchers+=("$launcher")

  started=$(awk '/^writing step/{step=$3} END{print step}' "$out")
  finished=$(awk '/^wrote step/{step=$3} END{print step}' "$out")
  left=none
  if compgen -G "run/checkpoints/*.tmp" >/dev/null; then
    left=$(cd run/checkpoints && echo *.tmp)
    interrupted=$((interrupted + 1))
  fi
  verified=$("$writer" verify run 2>&1) || fail "round $round: $verified"
  latest=$(awk '/^latest step/{print $3}' <<<"$verified")
  [[ -n $latest ]] || fail "round $round: no checkpoint found: $verified"
  ((latest >= finished && latest <= started)) ||
    fail "round $round: latest step $latest, but the writer had finished $finished and started $started"
  when="$moment s into writing step $started"
  [[ $moment == between ]] && when="right after writing step $finished"
  echo "round $round: killed $when (temporary left: $left); latest step $latest;" \
    "every checkpoint reads back as its step wrote it"
done

pid=
launcher=
for finished_launcher in "${launchers[@]}"; do wait "$finished_launcher" || true; done

# At least some kills must have hit a write in progress, or the test proved nothing about crashes.
((interrupted >= 2)) ||
  fail "only $interrupted of ${#moments[@]} kills left a temporary file behind"
rm -rf run  # 100+ MB
echo "test_checkpoint_kill: $interrupted of ${#moments[@]} kills interrupted a write; all checks passed"

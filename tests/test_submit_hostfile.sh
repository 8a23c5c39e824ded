#!/usr/bin/env bash
# hpc_train_submit --hostfile: DeepSpeed's hostfile format into mpirun's host list (--dry-run
# prints the command): comments, blank lines, a host without slots= (1 slot), --include and
# --exclude, the binding of --cpus-per-task, extra mpirun options; and the files it refuses
# (exit 2, the file and the line named).
set -euo pipefail
# shellcheck source=tests/support/script_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"

submit=${HPC_TRAIN_SUBMIT:?}
unset HPC_TRAIN_MPIRUN_ARGS
export HPC_TRAIN=hpc_train

# expect_command EXPECTED SUBMIT_ARGS...: --dry-run prints EXPECTED, and that line, run by bash
# with an mpirun that prints its arguments, gives the arguments it shows.
expect_command() {
  local expected=$1 printed
  shift
  printed=$("$submit" "$@" --dry-run -- --dataset 'my data.h5' --lr 1e-3) ||
    fail "$*: exit $?"
  [ "$printed" = "$expected --dataset 'my data.h5' --lr 1e-3" ] ||
    fail "$*: printed '$printed', expected '$expected ...'"
  mkdir -p bin
  printf '#!/bin/sh\nprintf "[%%s]" "$@"\n' > bin/mpirun
  chmod +x bin/mpirun
  [[ $(PATH="$PWD/bin:$PATH" bash -c "$printed") == *"hpc_train][--dataset][my data.h5][--lr][1e-3]" ]] ||
    fail "$*: the printed command does not give hpc_train its options"
}

# DeepSpeed's hostfile: "host slots=N", comments, blank lines; no slots= is one slot.
cat > hostfile <<'EOF'
# the cluster
worker-1 slots=4

  worker-2	slots=4   # indented, a tab, a comment
# worker-9 slots=8
worker-3
EOF
expect_command "mpirun -np 9 -H worker-1:4,worker-2:4,worker-3:1 --map-by slot hpc_train" \
  --hostfile hostfile
expect_command "mpirun -np 8 -H worker-1:4,worker-2:4 --map-by ppr:4:node hpc_train" \
  --hostfile hostfile --exclude worker-3
expect_command "mpirun -np 5 -H worker-1:4,worker-3:1 --map-by slot hpc_train" \
  --hostfile hostfile --include worker-3,worker-1
expect_command "mpirun -np 4 -H worker-2:4 --map-by ppr:4:node:PE=6 --bind-to core -x NCCL_DEBUG hpc_train" \
  --hostfile hostfile --include worker-2 --cpus-per-task 6 --mpirun-args "-x NCCL_DEBUG"
HPC_TRAIN_MPIRUN_ARGS="--oversubscribe" expect_command \
  "mpirun -np 4 -H worker-2:4 --map-by ppr:4:node --oversubscribe --mca pml ob1 hpc_train" \
  --hostfile hostfile --include worker-2 --mpirun-args "--mca pml ob1"
printf 'node-a.example.org slots=2\n192.168.1.7 slots=2' > dotted  # no newline at the end
expect_command "mpirun -np 4 -H node-a.example.org:2,192.168.1.7:2 --map-by ppr:2:node hpc_train" \
  --hostfile dotted
HPC_TRAIN="/opt/my build/hpc_train" expect_command \
  "mpirun -np 4 -H node-a.example.org:2,192.168.1.7:2 --map-by ppr:2:node '/opt/my build/hpc_train'" \
  --hostfile dotted

# Refused, with the file and line.
refuse() {
  local message=$1 content=$2
  shift 2
  printf '%b' "$content" > bad
  expect_failure 2 "$message" "$submit" --hostfile bad "$@" --dry-run -- --epochs 1
  [ ! -s stdout.txt ] || fail "refused hostfile: printed $(cat stdout.txt)"
}
refuse "bad:3: host a is listed twice" "a slots=2\nb slots=2\na slots=1\n"
refuse "bad:2: expected 'host slots=N', found 'b slots=x'" "a slots=2\nb slots=x\n"
refuse "bad:1: expected 'host slots=N', found 'a slots=-1'" "a slots=-1\n"
refuse "bad:1: slots=0 for a: at least 1" "a slots=0\n"
refuse "bad:2: expected 'host slots=N', found 'a slots=2 max_slots=4'" "# x\na slots=2 max_slots=4\n"
refuse "bad:1: expected 'host slots=N', found 'a b'" "a b\n"
refuse "bad:1: 'a:2' is not a host name" "a:2 slots=2\n"
refuse "hostfile bad names no host" "# nothing\n\n"
refuse "--include/--exclude: host 'c' is not in bad" "a slots=1\nb slots=1\n" --include c
refuse "--exclude leaves no host of bad" "a slots=1\n" --exclude a
refuse "--include and --exclude together" "a slots=1\nb\n" --include a --exclude b
refuse "GPU indices (host:0,1) and '@' are not supported" "a slots=2\n" --include a:0
refuse "--nodes is a Slurm option; --hostfile runs without Slurm" "a\n" --nodes 2
expect_failure 2 "hostfile missing.txt: no such file" "$submit" --hostfile missing.txt -- --epochs 1
expect_failure 2 "hostfile $work: not a readable file" "$submit" --hostfile "$work" -- --epochs 1
expect_failure 2 "--hostfile needs a value" "$submit" --hostfile
expect_failure 2 "--include/--exclude filter a --hostfile's hosts" "$submit" --nodes 1 \
  --gpus-per-node 1 --include a -- --epochs 1
echo "hpc_train_submit hostfiles passed"

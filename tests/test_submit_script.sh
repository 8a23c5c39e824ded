#!/usr/bin/env bash
# hpc_train_submit's Slurm batch script, without Slurm: the --dry-run output (#SBATCH lines,
# module loads, the mpirun line), bash -n on it, and the script run with stand-ins for mpirun,
# hpc_train_elastic, module and scontrol that record their argument vectors, which must be the
# options given, byte for byte (a value with spaces, quotes, $, a newline survives). Then the
# time-limit path (USR1 -> hpc_train's exit 75 -> scontrol requeue), the elastic variant, --cpu,
# the default module, a submission through stand-ins for sbatch and scontrol, and usage errors.
# Lines of the batch script are matched in single quotes, $ and \ as written.
# shellcheck disable=SC2016,SC1003
set -euo pipefail
# shellcheck source=tests/support/script_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"

submit=${HPC_TRAIN_SUBMIT:?}
[ -x "$submit" ] || fail "$submit: missing or not executable"
unset HPC_TRAIN_MPIRUN_ARGS HPC_TRAIN_ELASTIC LMOD_PKG MODULESHOME LMOD_CMD
export HPC_TRAIN="/opt/hpc train/bin/hpc_train"

# Stand-ins: each writes its argument vector, NUL-separated, to $work/argv.<name>.
fake=$work/fake-bin
mkdir -p "$fake"
for name in mpirun hpc_train_elastic module scontrol sbatch; do
  cat > "$fake/$name" <<'EOF'
#!/usr/bin/env bash
name=$(basename "$0")
printf '%s\0' "$@" > "$FAKE_LOG/argv.$name"
[ "$name" != module ] || echo "$*" >> "$FAKE_LOG/module.log"
case $name in
  sbatch) echo "4711;hpctrain" ;;
  mpirun | hpc_train_elastic)
    case ${FAKE_MODE:-ok} in
      ok) exit 0 ;;
      fail) exit 3 ;;
      preempt)  # hpc_train: USR1 -> checkpoint -> exit 75
        trap 'echo "$name: USR1" >> "$FAKE_LOG/events"; exit 75' USR1
        touch "$FAKE_LOG/started"
        while :; do sleep 0.05; done ;;
    esac ;;
esac
EOF
  chmod +x "$fake/$name"
done
export FAKE_LOG=$work

# expect_argv NAME WORDS...: the stand-in NAME was called with exactly WORDS.
expect_argv() {
  local name=$1 i
  shift
  local -a got=()
  [ -f "argv.$name" ] || fail "$name was not called"
  mapfile -d '' got < "argv.$name"
  local -a want=("$@")
  for ((i = 0; i < ${#want[@]} || i < ${#got[@]}; i++)); do
    [ "${got[$i]-<none>}" == "${want[$i]-<none>}" ] ||
      fail "$name: argument $i is '${got[$i]-<none>}', expected '${want[$i]-<none>}' (all: $(printf '[%s] ' "${got[@]}"))"
  done
  rm -f "argv.$name"
}

# run_script FILE [ENV...]: the batch script as Slurm would run it, with the stand-ins.
run_script() {
  local file=$1
  shift
  env PATH="$fake:$PATH" SLURM_JOB_ID=4242 SLURM_JOB_NODELIST='n[1-2]' "$@" bash "$file"
}

# The options hpc_train must get unchanged: spaces, both quotes, $, `, ;, *, #, a newline, an
# empty word, a backslash.
train_args=(--dataset "$work/data dir/x.h5" --model resnet18
  --tensorboard-job-name "it's a \"quoted\" name" --lr 1e-3 '$HOME `id` ; *' '#not a comment'
  $'two\nlines' '' 'back\slash' --epochs 10)

# ---- (1) GPU job: the #SBATCH lines, modules, mpirun ----------------------------------------
"$submit" --nodes 2 --gpus-per-node 4 --cpus-per-task 8 --time 1:30:00 --partition gpu \
  --account proj1 --job-name cifar --run-root "$work/runs" --module cuda/12.4 \
  --module hpc_train/0.1.0 --dry-run -- "${train_args[@]}" > job.sbatch 2> dry.err ||
  fail "--dry-run failed: $(cat dry.err)"
echo "---- job.sbatch"; cat job.sbatch; echo "----"
[ ! -e "$work/runs" ] || fail "--dry-run made $work/runs"
bash -n job.sbatch || fail "job.sbatch: bash -n"
[ "$(head -n 1 job.sbatch)" = '#!/bin/bash' ] || fail "no #!/bin/bash line"
expected_sbatch="#SBATCH --job-name=cifar
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=1:30:00
#SBATCH --partition=gpu
#SBATCH --account=proj1
#SBATCH --output=$work/runs/cifar-%j/slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@120"
[ "$(grep '^#SBATCH' job.sbatch)" = "$expected_sbatch" ] ||
  fail "#SBATCH lines: $(grep '^#SBATCH' job.sbatch)"
# sbatch reads #SBATCH lines up to the first command: they come first, before any command.
first_command=$(grep -n -v -e '^#' -e '^$' job.sbatch | head -n 1 | cut -d: -f1)
last_sbatch=$(grep -n '^#SBATCH' job.sbatch | tail -n 1 | cut -d: -f1)
[ "$last_sbatch" -lt "$first_command" ] || fail "an #SBATCH line after the first command"
[ "$(grep '^module load' job.sbatch)" = "module load cuda/12.4 || exit 1
module load hpc_train/0.1.0 || exit 1" ] || fail "module loads: $(grep module job.sbatch)"
grep -qxF 'mpirun -np 8 --map-by ppr:4:node:PE=8 --bind-to core \' job.sbatch ||
  fail "no mpirun line with the binding"
grep -qxF '  "$hpc_train" --run-dir "$run_dir" --resume auto \' job.sbatch ||
  fail "no hpc_train line with --run-dir and --resume auto"
grep -q 'hpc_train_elastic\|--no-kill' job.sbatch && fail "elastic lines in a job without --min-nodes"

rm -f module.log
run_script job.sbatch > run.out 2>&1 || fail "the batch script failed: $(cat run.out)"
[ "$(cat module.log)" = "load cuda/12.4
load hpc_train/0.1.0" ] || fail "module calls: $(cat module.log)"
expect_argv mpirun -np 8 --map-by ppr:4:node:PE=8 --bind-to core "$HPC_TRAIN" \
  --run-dir "$work/runs/cifar-4242" --resume auto "${train_args[@]}"
grep -q "job 4242 start 0 on n\[1-2\]: run directory $work/runs/cifar-4242" run.out ||
  fail "no start line: $(cat run.out)"
grep -q 'job 4242: hpc_train exited with 0' run.out || fail "no end line"

# hpc_train's exit status is the job's.
status=0
run_script job.sbatch FAKE_MODE=fail > run.out 2>&1 || status=$?
[ "$status" = 3 ] || fail "the script exited with $status when hpc_train exited with 3"
[ ! -e argv.scontrol ] || fail "scontrol called after a failure"

# The time limit: USR1 to the batch shell reaches mpirun, hpc_train checkpoints (exit 75), the
# job requeues itself; after HPC_TRAIN_MAX_REQUEUES restarts it stops with 75.
rm -f started events
# (env, then bash, in place of this background process: its pid is the batch shell's.)
env PATH="$fake:$PATH" SLURM_JOB_ID=4242 SLURM_JOB_NODELIST=n1 FAKE_MODE=preempt \
  bash job.sbatch > run.out 2>&1 &
job_pid=$!
for ((i = 0; i < 100; i++)); do [ -e started ] && break; sleep 0.1; done
[ -e started ] || fail "the stand-in mpirun did not start"
kill -USR1 "$job_pid"
status=0
wait "$job_pid" || status=$?
cat run.out
[ "$status" = 0 ] || fail "the preempted script exited with $status, not 0 after requeueing"
grep -q 'mpirun: USR1' events || fail "USR1 did not reach mpirun"
expect_argv scontrol requeue 4242
rm -f started
env PATH="$fake:$PATH" SLURM_JOB_ID=4242 SLURM_JOB_NODELIST=n1 FAKE_MODE=preempt \
  SLURM_RESTART_COUNT=2 HPC_TRAIN_MAX_REQUEUES=2 bash job.sbatch > run.out 2>&1 &
job_pid=$!
for ((i = 0; i < 100; i++)); do [ -e started ] && break; sleep 0.1; done
kill -TERM "$job_pid"
status=0
wait "$job_pid" || status=$?
[ "$status" = 75 ] || fail "after the last requeue the script exited with $status, not 75"
[ ! -e argv.scontrol ] || fail "requeued beyond HPC_TRAIN_MAX_REQUEUES"

# ---- (2) elastic: --no-kill, hpc_train_elastic --------------------------------------------
"$submit" --nodes 4 --gpus-per-node 2 --cpus-per-task 6 --min-nodes 2 --max-restarts 5 \
  --mpirun-args "--mca btl ^openib" --run-root "$work/runs" --no-module --dry-run -- \
  "${train_args[@]}" > elastic.sbatch 2> dry.err || fail "elastic --dry-run: $(cat dry.err)"
echo "---- elastic.sbatch"; sed -n '/^#SBATCH/,/^program=/p' elastic.sbatch; echo "----"
bash -n elastic.sbatch || fail "elastic.sbatch: bash -n"
grep -qxF '#SBATCH --no-kill' elastic.sbatch || fail "elastic: no #SBATCH --no-kill"
grep -q '^module' elastic.sbatch && fail "--no-module: a module line"
grep -q '^mpirun' elastic.sbatch && fail "elastic: mpirun run directly"
run_script elastic.sbatch > run.out 2>&1 || fail "elastic script: $(cat run.out)"
# hpc_train_elastic places and binds the ranks (from SLURM_CPUS_PER_TASK) and adds --resume auto.
expect_argv hpc_train_elastic --min-nodes 2 --max-restarts 5 --ranks-per-node 2 \
  --mpirun-args "--mca btl ^openib" -- "$HPC_TRAIN" \
  --run-dir "$work/runs/hpc_train-4242" "${train_args[@]}"
# --max-restarts defaults to 3; --min-nodes equal to --nodes is a plain job.
"$submit" --nodes 2 --gpus-per-node 2 --min-nodes 1 --no-module --dry-run -- --epochs 1 > e.sbatch
grep -qxF -- 'hpc_train_elastic --min-nodes 1 --max-restarts 3 --ranks-per-node 2 -- \' e.sbatch ||
  fail "default --max-restarts, no --mpirun-args: $(grep -A1 hpc_train_elastic e.sbatch)"
"$submit" --nodes 2 --gpus-per-node 2 --min-nodes 2 --no-module --dry-run -- --epochs 1 > e.sbatch
grep -q 'no-kill\|hpc_train_elastic' e.sbatch && fail "--min-nodes = --nodes made an elastic job"

# ---- (3) --cpu: no GPUs, hpc_train --device cpu, no binding; HPC_TRAIN_MPIRUN_ARGS ------------
HPC_TRAIN_MPIRUN_ARGS="--mca pml ob1" "$submit" --nodes 1 --cpu --ntasks-per-node 3 \
  --run-root runs --no-module --checkpoint-every-minutes 30 --dry-run -- --epochs 1 > cpu.sbatch
grep -q 'gpus-per-node' cpu.sbatch && fail "--cpu: a --gpus-per-node line"
grep -qxF '#SBATCH --ntasks-per-node=3' cpu.sbatch || fail "--cpu: no --ntasks-per-node=3"
grep -qxF "#SBATCH --output=$work/runs/hpc_train-%j/slurm-%j.out" cpu.sbatch ||
  fail "a relative --run-root is not made absolute"
run_script cpu.sbatch > run.out 2>&1 || fail "cpu script: $(cat run.out)"
expect_argv mpirun -np 3 --map-by ppr:3:node --bind-to none --mca pml ob1 "$HPC_TRAIN" \
  --run-dir "$work/runs/hpc_train-4242" --resume auto --epochs 1 --checkpoint-every-minutes 30 \
  --device cpu
# --checkpoint-every-minutes goes to an hpc_train that has it (or that is not on this machine).
printf '#!/bin/sh\necho "  --checkpoint-every-minutes arg  minutes between checkpoints"\n' > new_train
printf '#!/bin/sh\necho "  --checkpoint-every arg"\n' > old_train
chmod +x new_train old_train
HPC_TRAIN=$work/new_train "$submit" --nodes 1 --gpus-per-node 1 --checkpoint-every-minutes 7.5 \
  --no-module --dry-run -- --epochs 1 > minutes.sbatch
grep -qF -- '--epochs 1 --checkpoint-every-minutes 7.5 &' minutes.sbatch ||
  fail "--checkpoint-every-minutes 7.5 not passed on: $(grep -A2 hpc_train minutes.sbatch)"
HPC_TRAIN=$work/old_train expect_failure 2 "this hpc_train ($work/old_train) has no such option" \
  "$submit" --nodes 1 --gpus-per-node 1 --checkpoint-every-minutes 30 --dry-run -- --epochs 1
expect_failure 2 "--checkpoint-every-minutes must be a number of minutes above 0, not '0'" \
  "$submit" --nodes 1 --gpus-per-node 1 --checkpoint-every-minutes 0 --dry-run -- --epochs 1

# ---- (4) the default module: hpc_train, where a module command exists ------------------------
mkdir -p lmod/init && : > lmod/init/bash
LMOD_PKG=$work/lmod "$submit" --nodes 1 --gpus-per-node 1 --dry-run -- --epochs 1 > default.sbatch
grep -qxF "type module > /dev/null 2>&1 || source $work/lmod/init/bash" default.sbatch ||
  fail "default module: no init line: $(grep module default.sbatch)"
[ "$(grep '^module load' default.sbatch)" = "module load hpc_train || exit 1" ] ||
  fail "default module: not 'module load hpc_train'"
rm -f module.log
run_script default.sbatch > run.out 2>&1 || fail "default.sbatch: $(cat run.out)"
[ "$(cat module.log)" = "load hpc_train" ] || fail "default module: $(cat module.log)"

# ---- (5) a submission, through stand-ins for sbatch and scontrol ----------------------------
PATH="$fake:$PATH" "$submit" --nodes 1 --gpus-per-node 2 --job-name sub --run-root "$work/subs" \
  --no-module -- --epochs 1 > submit.out || fail "submission failed"
cat submit.out
script=$(find "$work/subs" -name 'sub-*.sbatch')
{ [ "$(echo "$script" | wc -l)" = 1 ] && [ -f "$script" ]; } || fail "no batch script in $work/subs"
[[ $(basename "$script") =~ ^sub-[0-9]{8}-[0-9]{6}\.sbatch$ ]] || fail "script name $script"
expect_argv sbatch --parsable --hold "$script"
[ -d "$work/subs/sub-4711" ] || fail "the run directory was not made before the release"
expect_argv scontrol release 4711
grep -qxF "Submitted job 4711: 1 node(s) x 2 rank(s)" submit.out || fail "no job id line"
grep -qxF "Run directory: $work/subs/sub-4711" submit.out || fail "no run directory line"
grep -qxF "Watch it:      squeue -j 4711" submit.out || fail "no squeue line"
grep -qxF "               tail -f $work/subs/sub-4711/slurm-4711.out" submit.out || fail "no tail line"

# ---- (6) usage errors: exit 2, a message ----------------------------------------------------
expect_failure 2 "--nodes N is missing" "$submit" --gpus-per-node 4 -- --epochs 1
expect_failure 2 "--gpus-per-node G is missing" "$submit" --nodes 2 -- --epochs 1
expect_failure 2 "--nodes must be a positive integer, not 'two'" "$submit" --nodes two --gpus-per-node 4 --
expect_failure 2 "--cpus-per-task must be a positive integer, not '0'" "$submit" --nodes 1 --gpus-per-node 4 --cpus-per-task 0 --
expect_failure 2 "no '--'" "$submit" --nodes 2 --gpus-per-node 4
expect_failure 2 "unknown option '--dataset'" "$submit" --nodes 2 --gpus-per-node 4 --dataset x.h5 --
expect_failure 2 "--time: '4h' is not a Slurm time" "$submit" --nodes 1 --gpus-per-node 1 --time 4h --
expect_failure 2 "--min-nodes 3 is more than --nodes 2" "$submit" --nodes 2 --gpus-per-node 1 --min-nodes 3 --
expect_failure 2 "--max-restarts is for elastic jobs" "$submit" --nodes 2 --gpus-per-node 1 --max-restarts 2 --
expect_failure 2 "--run-dir after --" "$submit" --nodes 1 --gpus-per-node 1 -- --run-dir x
expect_failure 2 "--resume after --" "$submit" --nodes 1 --gpus-per-node 1 -- --resume=auto
expect_failure 2 "--job-name: 'a b'" "$submit" --nodes 1 --gpus-per-node 1 --job-name 'a b' --
expect_failure 2 "--run-root: '/x y'" "$submit" --nodes 1 --gpus-per-node 1 --run-root '/x y' --
expect_failure 2 "--nodes needs a value" "$submit" --nodes
"$submit" --help > help.out || fail "--help exited non-zero"
grep -q '^usage: hpc_train_submit --nodes N --gpus-per-node G' help.out || fail "--help: no usage"
echo "hpc_train_submit batch scripts passed"

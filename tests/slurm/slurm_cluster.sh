#!/usr/bin/env bash
# A one-node Slurm cluster for the tests: munged, slurmctld and slurmd, each with its files in
# one directory, so that nothing system-wide is read, written or clobbered.
#
#   slurm_cluster.sh start    write slurm.conf, start the daemons that are not running, wait
#                             until the node is idle (idempotent)
#   slurm_cluster.sh stop     cancel the cluster's jobs, stop the daemons through their pid
#                             files and wait for them to exit (safe to call twice)
#   slurm_cluster.sh status   print the node and the queue
#
# Environment:
#   HPC_TRAIN_SLURM_DIR       the cluster's directory (default: ./slurm-cluster); `source
#                             $HPC_TRAIN_SLURM_DIR/env.sh` points the Slurm commands at it
#   HPC_TRAIN_SLURM_PORT      slurmctld's port; slurmd uses the next one. Default: from a hash
#                             of the directory, in 17000-24999: not Slurm's 6817/6818, so that
#                             a site's own Slurm is left alone, and not another build tree's.
#   HPC_TRAIN_SLURM_CPUS      CPUs the node declares (default 4, whatever the machine has)
#   HPC_TRAIN_SLURM_START_TIMEOUT  seconds to wait for the node to become idle (default 60)
# Exit status: 0 done, 1 failure (with the daemons' log tails), 77 Slurm or munge not installed.
#
# In a container: proctrack/linuxproc and task/none (no cgroups), the node declares more CPUs
# than the machine has (SlurmdParameters=config_overrides), so that 3 tasks fit on 2 cores.
# Processes are only ever signalled by the pid in their pid file, after checking that this pid
# is the daemon that wrote it; never by name.
set -euo pipefail
# shellcheck source=tests/slurm/slurm_conf_shared.sh
source "$(dirname "${BASH_SOURCE[0]}")/slurm_conf_shared.sh"

action=${1:-}
dir=${HPC_TRAIN_SLURM_DIR:-$PWD/slurm-cluster}
cpus=${HPC_TRAIN_SLURM_CPUS:-4}
start_timeout_s=${HPC_TRAIN_SLURM_START_TIMEOUT:-60}
stop_timeout_s=30

fail() {
  echo "slurm_cluster: error: $*" >&2
  exit 1
}

mkdir -p "$dir"
dir=$(cd "$dir" && pwd -P)
conf=$dir/slurm.conf
node=$(hostname -s)
dir_hash=$(printf '%s' "$dir" | cksum | cut -d' ' -f1)
port=${HPC_TRAIN_SLURM_PORT:-$((17000 + 2 * (dir_hash % 4000)))}

# Unix socket paths are limited to 107 bytes. munged's socket and slurmstepd's sockets in the
# spool directory (<spool>/<node>_<job>.<step>) live under $dir unless that path is too long;
# then under a short directory in /tmp named after $dir (found again by `stop`).
if [ $((${#dir} + ${#node} + 32)) -le 107 ]; then
  run_dir=$dir/run
else
  run_dir=/tmp/hpc_train_slurm.$dir_hash
fi
munge_socket=$run_dir/munge.socket.2
spool_dir=$run_dir/spool

munged_pid_file=$dir/munge/munged.pid
slurmctld_pid_file=$dir/slurmctld.pid
slurmd_pid_file=$dir/slurmd.pid

# pid_file NAME: the daemon's pid file. marker NAME: what its command line holds (ours, not a
# site's daemon that happens to have the pid of a stale pid file).
pid_file() {
  case $1 in munged) echo "$munged_pid_file" ;; slurmctld) echo "$slurmctld_pid_file" ;;
             slurmd) echo "$slurmd_pid_file" ;; esac
}
marker() {
  case $1 in munged) echo "--socket=$munge_socket" ;; *) echo "-f $conf" ;; esac
}

# pid_of NAME: the pid in NAME's pid file when that process is alive and is our NAME.
pid_of() {
  local name=$1 file pid
  file=$(pid_file "$name")
  [ -f "$file" ] || return 1
  pid=$(tr -dc '0-9' < "$file")
  [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] || return 1
  tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$(marker "$name")" || return 1
  echo "$pid"
}

log_tails() {
  local f
  for f in "$dir/munge/munged.log" "$dir/log/slurmctld.log" "$dir/log/slurmd.log"; do
    [ -f "$f" ] || continue
    echo "---- last lines of $f" >&2
    tail -n 25 "$f" >&2
  done
}

# start_failed MESSAGE: the daemons' log tails, stop what did start, fail with MESSAGE.
start_failed() {
  log_tails
  stop >&2 || true
  fail "$1"
}

write_conf() {
  local new=$conf.new
  {
    cat <<EOF
# Written by tests/slurm/slurm_cluster.sh: a one-node test cluster; everything under
# $dir
ClusterName=hpctrain
SlurmctldHost=localhost
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmdSpoolDir=$spool_dir
SlurmctldPidFile=$slurmctld_pid_file
SlurmdPidFile=$slurmd_pid_file
SlurmdLogFile=$dir/log/slurmd.log
EOF
    shared_slurm_conf "$dir" "$munge_socket"
    cat <<EOF
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=1024 State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
  } > "$new"
  if cmp -s "$new" "$conf"; then
    rm -f "$new"
  else
    mv "$new" "$conf"
    # A controller already running from an older slurm.conf: restart the daemons.
    if pid_of slurmctld > /dev/null || pid_of slurmd > /dev/null; then
      echo "slurm_cluster: slurm.conf changed: restarting slurmctld and slurmd"
      stop_pid slurmd
      stop_pid slurmctld
    fi
  fi
  : > "$dir/plugstack.conf"
  cat > "$dir/env.sh" <<EOF
# Source this to use the test cluster: sinfo, squeue, sbatch, scontrol.
export SLURM_CONF=$conf
EOF
}

# stop_pid NAME: SIGTERM, wait, SIGKILL if it must, wait; remove the pid file.
stop_pid() {
  local name=$1 pid i
  if pid=$(pid_of "$name"); then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < stop_timeout_s * 20; i++)); do
      [ -d "/proc/$pid" ] || break
      sleep 0.05
    done
    if [ -d "/proc/$pid" ]; then
      echo "slurm_cluster: $name (pid $pid) ignored SIGTERM for ${stop_timeout_s} s: SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
      for ((i = 0; i < 50; i++)); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
    fi
    if [ -d "/proc/$pid" ]; then
      echo "slurm_cluster: error: $name (pid $pid) does not exit" >&2
      return 1
    fi
    echo "slurm_cluster: stopped $name (pid $pid)"
  fi
  rm -f "$(pid_file "$name")"
}

start() {
  for cmd in munged mungekey slurmctld slurmd sinfo sbatch scontrol; do
    if ! command -v "$cmd" > /dev/null; then
      echo "slurm_cluster: $cmd not found: apt-get install slurm-wlm munge" >&2
      exit 77
    fi
  done
  mkdir -p "$dir/log" "$dir/state" "$run_dir" "$spool_dir"
  chmod 755 "$dir" "$run_dir"
  mkdir -p "$dir/munge" && chmod 700 "$dir/munge"
  write_conf
  export SLURM_CONF=$conf

  # munged with a key of its own (never the site's /etc/munge/munge.key). --force: munged wants
  # every directory above its socket to be world-searchable, which a build tree under /root is
  # not; everything here runs as root anyway.
  if ! pid_of munged > /dev/null; then
    [ -s "$dir/munge/munge.key" ] || mungekey --create --keyfile="$dir/munge/munge.key" ||
      dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
    chmod 600 "$dir/munge/munge.key"
    rm -f "$munge_socket" "$munge_socket.lock"
    munged --force --socket="$munge_socket" --pid-file="$munged_pid_file" \
      --key-file="$dir/munge/munge.key" --log-file="$dir/munge/munged.log" \
      --seed-file="$dir/munge/munged.seed" || start_failed "munged did not start"
  fi
  # munged writes its pid file once it serves the socket.
  for ((i = 0; i < 100; i++)); do
    pid_of munged > /dev/null && [ -S "$munge_socket" ] && break
    sleep 0.1
  done
  pid_of munged > /dev/null || start_failed "munged is not running"

  if ! pid_of slurmctld > /dev/null; then
    # A fresh controller starts from an empty state: job ids from 1, no old jobs.
    rm -rf "$dir/state" && mkdir -p "$dir/state"
    rm -f "$dir/log/jobcomp.log"
    slurmctld -f "$conf" || start_failed "slurmctld did not start"
  fi
  if ! pid_of slurmd > /dev/null; then
    slurmd -f "$conf" -N "$node" || start_failed "slurmd did not start"
  fi

  local state="" started=$SECONDS
  while [ $((SECONDS - started)) -lt "$start_timeout_s" ]; do
    state=$(sinfo -h -N -n "$node" -o '%T' 2>/dev/null || true)
    [ "$state" = idle ] && break
    # A daemon that exits soon after forking (bad configuration, port in use) leaves no process
    # behind: after a few seconds for the pid files to appear, that is a failure.
    if [ $((SECONDS - started)) -ge 3 ]; then
      for name in slurmctld slurmd; do
        pid_of "$name" > /dev/null || start_failed "$name exited (see its log above)"
      done
    fi
    sleep 0.5
  done
  if [ "$state" != idle ]; then
    sinfo -N -l >&2 || true
    start_failed "node $node is '${state:-not reported}', not idle, after ${start_timeout_s} s"
  fi
  echo "slurm_cluster: node $node idle ($cpus CPUs); export SLURM_CONF=$conf"
}

stop() {
  local stop_failed=0
  if [ -f "$conf" ] && pid_of slurmctld > /dev/null; then
    export SLURM_CONF=$conf
    # Jobs would outlive slurmd (slurmstepd runs on its own): cancel them through Slurm and wait.
    if [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
      squeue -h -o %i | xargs -r scancel 2>/dev/null || true
      for ((i = 0; i < stop_timeout_s * 2; i++)); do
        [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
        sleep 0.5
      done
    fi
  fi
  # slurmd and slurmctld at once (each takes a second or two to save its state); munged last.
  stop_pid slurmd & local slurmd_stop=$!
  stop_pid slurmctld || stop_failed=1
  wait "$slurmd_stop" || stop_failed=1
  stop_pid munged || stop_failed=1
  [ "$stop_failed" = 0 ] || fail "a daemon did not stop (see above)"
  rm -f "$munge_socket" "$munge_socket.lock"
  # The short socket directory in /tmp, when one was used.
  case "$run_dir" in /tmp/hpc_train_slurm.*) rm -rf "$run_dir" ;; esac
  return 0
}

status() {
  export SLURM_CONF=$conf
  for name in munged slurmctld slurmd; do
    if pid=$(pid_of "$name"); then echo "$name: running (pid $pid)"; else echo "$name: stopped"; fi
  done
  if [ -f "$conf" ]; then sinfo -N -l 2>/dev/null || true; squeue 2>/dev/null || true; fi
}

case "$action" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac

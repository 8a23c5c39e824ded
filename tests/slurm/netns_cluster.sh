#!/usr/bin/env bash
# A Slurm cluster of several nodes on one machine, for the tests: each node is a network and UTS
# namespace of its own (its own host name, address and TCP ports), joined to the others by a veth
# pair on a bridge; the file system is shared, as on a cluster. Slurm, Open MPI's TCP transport
# and hpc_train see what they see on a real cluster: other host names, other addresses, and
# processes that vanish with their node.
#
#   netns_cluster.sh start            build the nodes, start munged + slurmctld on `head` and one
#                                     slurmd per compute node, wait until every node is idle
#   netns_cluster.sh stop             cancel the jobs, end every process of every node, remove
#                                     the namespaces, the links and the bridge (safe to call twice)
#   netns_cluster.sh status           the nodes, their processes and the queue
#   netns_cluster.sh exec NODE CMD..  run CMD on NODE (head, node1, ...)
#   netns_cluster.sh kill NODE        SIGKILL every process of NODE, slurmd included (a node lost)
#   netns_cluster.sh cut NODE         take NODE's link down: its processes live on, unreachable
#   netns_cluster.sh mend NODE        bring NODE's link up again
#   netns_cluster.sh revive NODE      mend NODE and start its slurmd again (after kill)
#   netns_cluster.sh bytes NODE       bytes received and sent on NODE's link ("rx tx")
#
# Environment:
#   HPC_TRAIN_CLUSTER_DIR    the cluster's directory (default ./netns-cluster); `source
#                            $HPC_TRAIN_CLUSTER_DIR/env.sh` puts sbatch, srun, squeue, scontrol,
#                            sinfo, scancel (run on `head`) and `on NODE CMD..` on the PATH
#   HPC_TRAIN_CLUSTER_NODES  compute nodes (default 3): node1..nodeN
#   HPC_TRAIN_CLUSTER_CPUS   CPUs each node declares (default 4, whatever the machine has)
# Exit status: 0 done, 1 failure (with the daemons' log tails), 77 not possible here (Slurm,
# munge or iproute2 missing, or no permission to make namespaces).
#
# The network: a bridge in a namespace of its own (the "switch"), so that nothing is added to
# the machine's own network namespace; addresses 10.213.K.0/24 (K from a hash of the directory,
# so that two build trees do not meet), head at .254, nodeI at .I. Only these addresses, on
# links made here, ever carry traffic. Namespace and link names carry the same hash.
#
# Host names: each node's UTS namespace is kept in a file (`unshare --uts=FILE`), the network
# namespace by `ip netns add`; `exec` enters both. Slurm finds nodes by NodeAddr, Open MPI by
# the addresses its daemons report, so no /etc/hosts entry is needed; mpirun -H node1,... starts
# its daemons through the agent $dir/bin/node-rsh (what ssh is on a cluster).
#
# A node's processes are those in its network namespace (/proc/PID/ns/net); they are signalled
# by that, never by name. In a container: proctrack/linuxproc and task/none (no cgroups), and
# the nodes may declare more CPUs than the machine has (SlurmdParameters=config_overrides).
set -euo pipefail
# shellcheck source=tests/slurm/slurm_conf_shared.sh
source "$(dirname "${BASH_SOURCE[0]}")/slurm_conf_shared.sh"

action=${1:-}
[ $# -gt 0 ] && shift
dir=${HPC_TRAIN_CLUSTER_DIR:-$PWD/netns-cluster}
node_count=${HPC_TRAIN_CLUSTER_NODES:-3}
cpus=${HPC_TRAIN_CLUSTER_CPUS:-4}
gpus=4  # declared only: see slurm.conf
start_timeout_s=60
stop_timeout_s=5  # hpc_train takes SIGTERM as a request to checkpoint and stop

fail() {
  echo "netns_cluster: error: $*" >&2
  exit 1
}

mkdir -p "$dir"
dir=$(cd "$dir" && pwd -P)
conf=$dir/slurm.conf
hash=$(printf '%s' "$dir" | cksum | cut -d' ' -f1)
tag=h$((hash % 10000))         # in every namespace and link name: <= 15 characters in all
subnet=10.213.$((hash % 250))  # a /24 of the private range, made here
port=$((17000 + 2 * (hash % 4000)))
switch_ns=${tag}sw
bridge=${tag}br
ns_dir=$dir/ns                 # the UTS namespaces' files
run_dir=/tmp/hpc_train_cluster.$hash  # sockets: short paths (sun_path is 108 bytes)
munge_socket=$run_dir/munge.socket.2

compute_nodes() { local i; for ((i = 1; i <= node_count; i++)); do echo "node$i"; done; }
all_nodes() { echo head; compute_nodes; }
netns_of() { echo "${tag}$1"; }
address_of() {
  case $1 in head) echo "$subnet.254" ;; node*) echo "$subnet.${1#node}" ;;
             *) fail "no node '$1' (head, node1..node$node_count)" ;; esac
}
# The switch-side end of NODE's veth pair (the node's own end is eth0).
port_of() { echo "${tag}p${1#node}"; }
valid_node() { address_of "$1" > /dev/null; }

# exec_on NODE CMD..: CMD in NODE's network and UTS namespaces.
exec_on() {
  local node=$1
  shift
  nsenter --net="/run/netns/$(netns_of "$node")" --uts="$ns_dir/$node.uts" -- "$@"
}

# pids_on NODE: the processes in NODE's network namespace.
pids_on() {
  [ -e "/run/netns/$(netns_of "$1")" ] || return 0
  ip netns pids "$(netns_of "$1")" 2>/dev/null || true
}

# end_node NODE [SIGNAL]: signal every process of NODE; with TERM, wait and then KILL.
end_node() {
  local node=$1 signal=${2:-TERM} pids i
  pids=$(pids_on "$node")
  [ -n "$pids" ] || return 0
  # shellcheck disable=SC2086  # a list of pids
  kill -"$signal" $pids 2>/dev/null || true
  for ((i = 0; i < stop_timeout_s * 10; i++)); do
    [ -z "$(pids_on "$node")" ] && return 0
    sleep 0.1
  done
  pids=$(pids_on "$node")
  echo "netns_cluster: $node: processes $pids outlived SIG$signal for ${stop_timeout_s} s: SIGKILL" >&2
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do [ -z "$(pids_on "$node")" ] && return 0; sleep 0.1; done
  echo "netns_cluster: $node: processes $(pids_on "$node") do not exit" >&2
  return 1
}

log_tails() {
  local f
  for f in "$dir/log/munged.log" "$dir/log/slurmctld.log" "$dir"/log/slurmd-*.log; do
    [ -f "$f" ] || continue
    echo "---- last lines of $f" >&2
    tail -n 20 "$f" >&2
  done
}

start_failed() {
  log_tails
  stop >&2 || true
  fail "$1"
}

make_node() {
  local node=$1 netns port
  netns=$(netns_of "$node")
  port=$(port_of "$node")
  [ "$node" = head ] && port=${tag}ph
  ip netns add "$netns"
  ip link add eth0 netns "$netns" type veth peer name "$port" netns "$switch_ns"
  ip -n "$switch_ns" link set "$port" master "$bridge" up
  ip -n "$netns" addr add "$(address_of "$node")/24" dev eth0
  ip -n "$netns" link set eth0 up
  ip -n "$netns" link set lo up
  : > "$ns_dir/$node.uts"
  unshare --uts="$ns_dir/$node.uts" hostname "$node"
}

write_conf() {
  local nodes_list="node[1-$node_count]"
  {
    cat <<EOF
# Written by tests/slurm/netns_cluster.sh: a test cluster of $node_count nodes in network namespaces;
# everything under $dir
ClusterName=hpctrainnet
SlurmctldHost=head($(address_of head))
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmdSpoolDir=$run_dir/spool-%n
# The nodes share /tmp: each its own job temporary directory (PMIx puts its client directories
# there, named by job and step only).
TmpFS=$run_dir/tmp-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmdLogFile=$dir/log/slurmd-%n.log
EOF
    shared_slurm_conf "$dir" "$munge_socket"
    cat <<EOF
# A node that stops answering is DOWN after SlurmdTimeout s (a lost node), and comes back by
# itself once its slurmd registers again.
SlurmdTimeout=10
MessageTimeout=5
# Each node declares GPUs (empty files for devices), so that GPU job scripts are scheduled as
# on a GPU cluster; a CPU build of hpc_train runs on the CPU whatever Slurm hands it.
GresTypes=gpu
NodeName=DEFAULT CPUs=$cpus RealMemory=1024 Gres=gpu:$gpus State=UNKNOWN
EOF
  } > "$conf"
  # Slurm counts a node's GPUs by their device files: empty files stand in for them.
  mkdir -p "$dir/dev"
  for ((i = 0; i < gpus; i++)); do : > "$dir/dev/gpu$i"; done
  printf 'AutoDetect=off\nNodeName=node[1-%d] Name=gpu File=%s/dev/gpu[0-%d]\n' "$node_count" \
    "$dir" $((gpus - 1)) > "$dir/gres.conf"
  local node
  for node in $(compute_nodes); do
    echo "NodeName=$node NodeAddr=$(address_of "$node")" >> "$conf"
  done
  echo "PartitionName=debug Nodes=$nodes_list Default=YES MaxTime=INFINITE State=UP" >> "$conf"
  : > "$dir/plugstack.conf"

  # The Slurm commands run on head (the login node); `on NODE CMD..` anywhere.
  mkdir -p "$dir/bin"
  local command script=$(readlink -f "$0")
  for command in sbatch srun salloc squeue scontrol sinfo scancel sacct; do
    printf '#!/bin/sh\nexec bash %q exec head %q "$@"\n' "$script" "$(command -v "$command" || echo "$command")" \
      > "$dir/bin/$command"
  done
  printf '#!/bin/sh\nnode=$1; shift\nexec bash %q exec "$node" "$@"\n' "$script" > "$dir/bin/on"
  # Open MPI's rsh agent: `node-rsh [options] HOST COMMAND..`, as ssh is called.
  cat > "$dir/bin/node-rsh" <<EOF
#!/bin/sh
while [ \$# -gt 0 ]; do case \$1 in -*) shift ;; *) break ;; esac; done
host=\$1; shift
exec bash $(printf %q "$script") exec "\$host" sh -c "\$*"
EOF
  chmod +x "$dir/bin"/*
  cat > "$dir/env.sh" <<EOF
# Source this to use the test cluster: the Slurm commands (on head), \`on NODE CMD..\`, and
# mpirun -H node1,... through the agent node-rsh (OMPI_MCA_plm_rsh_agent).
export HPC_TRAIN_CLUSTER_DIR=$dir
export SLURM_CONF=$conf
export PATH=$dir/bin:\$PATH
export HPC_TRAIN_CLUSTER_RSH=$dir/bin/node-rsh
EOF
}

start() {
  local cmd
  for cmd in munged mungekey slurmctld slurmd sinfo sbatch scontrol ip nsenter unshare; do
    if ! command -v "$cmd" > /dev/null; then
      echo "netns_cluster: $cmd not found: apt-get install slurm-wlm munge iproute2" >&2
      exit 77
    fi
  done
  # A cluster of this directory that is up already: stop it first (a clean start).
  [ -e "/run/netns/$switch_ns" ] && stop
  if ! ip netns add "$switch_ns" 2> "$dir/netns.err"; then
    echo "netns_cluster: cannot make network namespaces here: $(cat "$dir/netns.err")" >&2
    exit 77
  fi
  mkdir -p "$dir/log" "$dir/state" "$ns_dir" "$run_dir" "$dir/munge"
  chmod 700 "$dir/munge"
  rm -rf "$dir/state"/* "$dir/log"/*
  ip -n "$switch_ns" link add "$bridge" type bridge
  ip -n "$switch_ns" link set "$bridge" up
  local node
  for node in $(all_nodes); do make_node "$node"; done
  write_conf
  export SLURM_CONF=$conf

  [ -s "$dir/munge/munge.key" ] || mungekey --create --keyfile="$dir/munge/munge.key" ||
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 600 "$dir/munge/munge.key"
  rm -f "$munge_socket" "$munge_socket.lock"
  # One munged (on head) with a key of its own: its socket is a file, which every node's
  # processes reach through the shared file system, as a cluster shares one key.
  exec_on head munged --force --origin="$(address_of head)" --socket="$munge_socket" --pid-file="$dir/munge/munged.pid" \
    --key-file="$dir/munge/munge.key" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munged.seed" || start_failed "munged did not start"
  for ((i = 0; i < 100; i++)); do [ -S "$munge_socket" ] && break; sleep 0.1; done
  exec_on head slurmctld -f "$conf" || start_failed "slurmctld did not start"
  for node in $(compute_nodes); do
    mkdir -p "$run_dir/spool-$node" "$run_dir/tmp-$node"
    exec_on "$node" slurmd -f "$conf" -N "$node" || start_failed "slurmd on $node did not start"
  done
  wait_idle
  echo "slurm netns cluster: $(compute_nodes | tr '\n' ' ')idle ($cpus CPUs each) on $subnet.0/24; source $dir/env.sh"
}

# wait_idle [NODE..]: until the nodes (default: all) report idle.
wait_idle() {
  local nodes=("$@") started=$SECONDS states
  [ ${#nodes[@]} -gt 0 ] || mapfile -t nodes < <(compute_nodes)
  while [ $((SECONDS - started)) -lt "$start_timeout_s" ]; do
    states=$(exec_on head sinfo -h -N -n "$(IFS=,; echo "${nodes[*]}")" -o '%T' 2>/dev/null | sort -u || true)
    [ "$states" = idle ] && return 0
    sleep 0.5
  done
  exec_on head sinfo -N -l >&2 || true
  start_failed "nodes ${nodes[*]} not idle after ${start_timeout_s} s: ${states:-no answer}"
}

stop() {
  local node stop_failed=0
  export SLURM_CONF=$conf
  if [ -e "/run/netns/$(netns_of head)" ] && [ -n "$(pids_on head)" ]; then
    local jobs
    jobs=$(exec_on head squeue -h -o %i 2>/dev/null || true)
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086
      exec_on head scancel $jobs 2>/dev/null || true
      for ((i = 0; i < stop_timeout_s * 2; i++)); do
        [ -z "$(exec_on head squeue -h -o %i 2>/dev/null)" ] && break
        sleep 0.5
      done
    fi
  fi
  for node in $(compute_nodes) head; do
    end_node "$node" TERM || stop_failed=1
  done
  for node in $(all_nodes); do
    ip netns del "$(netns_of "$node")" 2>/dev/null || true
    if [ -e "$ns_dir/$node.uts" ]; then
      umount "$ns_dir/$node.uts" 2>/dev/null || true
      rm -f "$ns_dir/$node.uts"
    fi
  done
  ip netns del "$switch_ns" 2>/dev/null || true
  rm -rf "$run_dir"
  [ "$stop_failed" = 0 ] || fail "processes of the cluster did not end (see above)"
  echo "slurm netns cluster stopped; namespaces and links removed"
}

status() {
  local node
  for node in $(all_nodes); do
    if [ -e "/run/netns/$(netns_of "$node")" ]; then
      echo "$node $(address_of "$node"): $(pids_on "$node" | wc -l) process(es), link $(ip -n "$switch_ns" -o link show "$( [ "$node" = head ] && echo "${tag}ph" || port_of "$node")" 2>/dev/null | grep -o 'state [A-Z]*' || echo '?')"
    else
      echo "$node: absent"
    fi
  done
  [ -e "/run/netns/$(netns_of head)" ] || return 0
  export SLURM_CONF=$conf
  exec_on head sinfo -N -l 2>/dev/null || true
  exec_on head squeue 2>/dev/null || true
}

case "$action" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  exec)
    [ $# -ge 2 ] || fail "usage: $0 exec NODE COMMAND.."
    valid_node "$1"
    exec_on "$@"
    ;;
  kill)
    valid_node "${1:?usage: $0 kill NODE}"
    end_node "$1" KILL
    echo "netns_cluster: $1 killed (every process, slurmd included)"
    ;;
  cut)
    valid_node "${1:?usage: $0 cut NODE}"
    ip -n "$(netns_of "$1")" link set eth0 down
    echo "netns_cluster: $1's link is down"
    ;;
  mend)
    valid_node "${1:?usage: $0 mend NODE}"
    ip -n "$(netns_of "$1")" link set eth0 up
    ;;
  revive)
    valid_node "${1:?usage: $0 revive NODE}"
    ip -n "$(netns_of "$1")" link set eth0 up
    export SLURM_CONF=$conf
    [ -n "$(pids_on "$1")" ] && end_node "$1" TERM
    exec_on "$1" slurmd -f "$conf" -N "$1"
    wait_idle "$1"
    ;;
  bytes)
    valid_node "${1:?usage: $0 bytes NODE}"
    # (sysfs shows the machine's own namespace: ask the node's through netlink.)
    ip -n "$(netns_of "$1")" -s -o link show eth0 |
      sed -E 's/.*RX: *bytes[^\\]*\\ *([0-9]+).*TX: *bytes[^\\]*\\ *([0-9]+).*/\1 \2/' 
    ;;
  *)
    echo "usage: $0 start|stop|status|exec NODE CMD..|kill NODE|cut NODE|mend NODE|revive NODE|bytes NODE" >&2
    exit 2
    ;;
esac

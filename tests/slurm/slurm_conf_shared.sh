# Sourced by the test clusters (slurm_cluster.sh: one node; netns_cluster.sh: nodes in network
# namespaces): what their slurm.conf files share.
#
# shared_slurm_conf DIR MUNGE_SOCKET: the lines for a test cluster whose files are under DIR
# (state, the controller's log, the job completion log, plugstack.conf) and whose munged
# listens on MUNGE_SOCKET; each cluster adds its name, hosts, ports, slurmd paths and nodes.
shared_slurm_conf() {
  local dir=$1 munge_socket=$2
  cat <<EOF
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$munge_socket,cred_expire=10
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$dir/plugstack.conf
# No cgroups in a container.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# No slurmdbd, so sacct has nothing: finished jobs are written to a text file instead
# (JobState, ExitCode), and stay in slurmctld's memory for at least MinJobAge s, for scontrol
# show job. sbatch --wait polls after 2 s, then every 4x longer while that stays below
# MinJobAge/2 (at most 32 s): MinJobAge=16 keeps the polls 8 s apart, so a job is still in
# memory for 8 s or more when sbatch --wait returns.
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.log
MinJobAge=16
# A requeued job waits until the job credential it ran with has expired (AuthInfo cred_expire,
# default 120 s) plus the next pass of the scheduler (sched_interval, default 60 s; backfill's
# bf_interval, default 30 s): with 10 s and 2 s it starts again ~12 s after scontrol requeue.
JobRequeue=1
SchedulerParameters=sched_interval=2,bf_interval=2
ReturnToService=2
KillWait=5
MailProg=/bin/true
# Nodes may declare more CPUs and other memory than the machine has.
SlurmdParameters=config_overrides
EOF
}

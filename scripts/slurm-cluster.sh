#!/usr/bin/env bash
# Start or stop a small real Slurm cluster on this one machine, for the `slurm` scheduler and its tests.
#
#   eval "$(scripts/slurm-cluster.sh start)"   # prints `export SLURM_CONF=...` on stdout
#   scripts/slurm-cluster.sh status            # exit 0 when the controller answers and the nodes are up
#   eval "$(scripts/slurm-cluster.sh env)"     # the exports again, for another shell
#   scripts/slurm-cluster.sh stop              # stops what `start` started (munged only if it started it)
#
# One controller (slurmctld) and three node daemons (slurmd -N n1..n3) share this machine: Debian's
# build allows several slurmd per machine when each has its own name and port. All of them share the
# machine's file system and address (127.0.0.1), like the simulated hosts of local mode. No accounting
# daemon: `sacct` does not answer here, as on many clusters. Everything (config, spool, logs, pids) lives
# in one state folder ($SMDDP_SLURM_DIR, default ~/.cache/smddp-sdk/slurm); nothing is written under
# /etc except what the packages install. Installing Debian's `slurmctld slurmd slurm-client munge` (when
# missing) and starting the daemons needs root. Never install the *-emulator packages: they replace slurmd.
set -euo pipefail

STATE=${SMDDP_SLURM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/smddp-sdk/slurm}
CONF=$STATE/slurm.conf
NODES=(n1 n2 n3)
CPUS_PER_NODE=${SMDDP_SLURM_CPUS:-4}   # declared, not real: two ranks per node plus room for a second job
CTLD_PORT=${SMDDP_SLURM_PORT:-16817}
NODE_PORTS="17001-17003"
MUNGE_SOCKET=/run/munge/munge.socket.2

say() { echo "slurm-cluster: $*" >&2; }
die() { say "error: $*"; exit 1; }

install_slurm() {
  local missing=()
  command -v slurmctld >/dev/null || missing+=(slurmctld)
  command -v slurmd >/dev/null || missing+=(slurmd)
  command -v sbatch >/dev/null || missing+=(slurm-client)
  command -v munged >/dev/null || missing+=(munge)
  ((${#missing[@]} == 0)) && return 0
  [[ $(id -u) == 0 ]] || die "${missing[*]} not installed; as root: apt-get install slurmctld slurmd slurm-client munge"
  command -v apt-get >/dev/null || die "${missing[*]} not installed and this is not a Debian-like system; install Slurm and MUNGE"
  say "installing Debian's ${missing[*]} (about a minute)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
}

write_config() {
  local host; host=$(hostname -s)
  mkdir -p "$STATE"/{state,spool,log,run}
  cat >"$CONF" <<EOF
# Written by scripts/slurm-cluster.sh: one controller and ${#NODES[@]} node daemons on this machine.
ClusterName=smddp
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job waits cred_expire+1 s (default 120) before it may start again, and the scheduler looks
# at waiting jobs every sched_interval s (default 60): short here, so that requeue tests take seconds.
AuthInfo=cred_expire=10
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmdTimeout=30
KillWait=5
MinJobAge=600
SlurmdParameters=config_overrides
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
NodeName=n[1-${#NODES[@]}] NodeHostname=$host NodeAddr=127.0.0.1 Port=[$NODE_PORTS] CPUs=$CPUS_PER_NODE RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=n[1-${#NODES[@]}] Default=YES MaxTime=INFINITE State=UP
EOF
  # Slurm refuses a config (and state) that group or others may write.
  chmod 644 "$CONF"
}

pid_of() {  # a live pid from a pid file, or nothing
  [[ -f $1 ]] || return 1
  local pid; pid=$(cat "$1")
  kill -0 "$pid" 2>/dev/null && echo "$pid"
}

start_munge() {
  if [[ -S $MUNGE_SOCKET ]] && munge -n </dev/null >/dev/null 2>&1; then return 0; fi
  [[ -f /etc/munge/munge.key ]] || { mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null || create-munge-key -f; }
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge && chown munge:munge /run/munge /var/log/munge /var/lib/munge
  runuser -u munge -- /usr/sbin/munged
  touch "$STATE/run/munged-started-here"
  local i; for i in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && return 0; sleep 0.1; done
  die "munged did not start (see /var/log/munge/munged.log)"
}

nodes_idle() {  # every node answers and none is down, draining or unknown
  local states; states=$(SLURM_CONF=$CONF timeout 10 sinfo -h -N -o '%N %t' 2>/dev/null) || return 1
  [[ $(grep -cE ' (idle|mix|alloc)$' <<<"$states") == "${#NODES[@]}" ]]
}

controller_answers() { SLURM_CONF=$CONF timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP'; }

cmd_start() {
  if controller_answers && nodes_idle; then
    say "cluster already running (state in $STATE)"; cmd_env; return 0
  fi
  install_slurm
  [[ $(id -u) == 0 ]] || die "starting slurmctld and slurmd needs root; run this script with sudo"
  write_config
  start_munge
  export SLURM_CONF=$CONF
  if ! pid_of "$STATE/run/slurmctld.pid" >/dev/null; then
    say "starting slurmctld and ${#NODES[@]} slurmd (state in $STATE)"
    setsid slurmctld -i </dev/null >>"$STATE/log/slurmctld.out" 2>&1
  fi
  local node
  for node in "${NODES[@]}"; do
    pid_of "$STATE/run/slurmd-$node.pid" >/dev/null || setsid slurmd -N "$node" </dev/null >>"$STATE/log/slurmd-$node.out" 2>&1
  done
  local i
  for i in $(seq 60); do
    if controller_answers && nodes_idle; then
      # Nodes a test left down come back here (ReturnToService only revives nodes that were unresponsive).
      scontrol update nodename="n[1-${#NODES[@]}]" state=resume >/dev/null 2>&1 || true
      say "cluster up: $(sinfo -h -o '%P %D nodes %t' | tr '\n' ' ')"; cmd_env; return 0
    fi
    if ((i == 20)); then scontrol update nodename="n[1-${#NODES[@]}]" state=resume >/dev/null 2>&1 || true; fi
    sleep 1
  done
  die "the nodes did not become idle within 60 s: $(sinfo -N -h 2>&1 | tr '\n' ';') (logs in $STATE/log)"
}

cmd_env() { echo "export SLURM_CONF=$CONF"; }

cmd_status() {
  [[ -f $CONF ]] || { say "not started (no $CONF)"; return 1; }
  controller_answers || { say "slurmctld does not answer"; return 1; }
  SLURM_CONF=$CONF sinfo -N >&2
  nodes_idle
}

stop_pidfile() {
  local pid; pid=$(pid_of "$1") || return 0
  kill "$pid" 2>/dev/null || true
  local i; for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

cmd_stop() {
  local node
  for node in "${NODES[@]}"; do stop_pidfile "$STATE/run/slurmd-$node.pid"; done
  stop_pidfile "$STATE/run/slurmctld.pid"
  if [[ -f $STATE/run/munged-started-here ]]; then
    stop_pidfile /run/munge/munged.pid
    rm -f "$STATE/run/munged-started-here"
  fi
  say "stopped"
}

case ${1:-} in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  env) cmd_env ;;
  *) echo "usage: $0 {start|stop|status|env}" >&2; exit 2 ;;
esac

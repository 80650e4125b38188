#!/usr/bin/env bash
# Start or stop a private Docker engine for smddp-sdk's Docker mode and tests, where none runs.
#
#   eval "$(scripts/docker-engine.sh start)"   # prints `export DOCKER_HOST=...` on stdout
#   scripts/docker-engine.sh status
#   scripts/docker-engine.sh stop [--purge]    # --purge also deletes the engine's images
#
# `start` does nothing when an engine already answers (DOCKER_HOST or the default socket); `stop` only
# stops an engine this script started. The private engine keeps everything under one state folder
# ($SMDDP_DOCKER_DIR, default ~/.cache/smddp-sdk/docker) and leaves the host firewall alone: it runs with
# --iptables=false --ip-forward=false --bridge=none, so it adds no NAT, no FORWARD DROP policy and no
# docker0 bridge that would break network-namespace tests later in the same boot. Containers reach each
# other on user-defined bridge networks; builds run with --network none (the image build is offline).
# Starting an engine needs root; Debian's docker.io is installed when dockerd is missing.
set -euo pipefail

STATE=${SMDDP_DOCKER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/smddp-sdk/docker}
SOCK=$STATE/docker.sock
PIDFILE=$STATE/dockerd.pid
LOG=$STATE/dockerd.log
EXEC_ROOT=$STATE/exec
DATA_ROOT=$STATE/data
SAVED=$STATE/host-state   # firewall and forwarding settings before start, restored by stop

say() { echo "docker-engine: $*" >&2; }
die() { say "error: $*"; exit 1; }

engine_answers() { timeout 10 docker ${1:+-H "$1"} info >/dev/null 2>&1; }

private_pid() {
  [[ -f $PIDFILE ]] || return 1
  local pid; pid=$(cat "$PIDFILE")
  kill -0 "$pid" 2>/dev/null && echo "$pid"
}

install_engine() {
  command -v dockerd >/dev/null && return 0
  [[ $(id -u) == 0 ]] || die "dockerd is not installed; install Docker (Debian/Ubuntu: sudo apt-get install docker.io) or run this as root"
  command -v apt-get >/dev/null || die "dockerd is not installed and this is not a Debian-like system; install Docker Engine"
  say "installing Debian's docker.io (about 30 s)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io >/dev/null
}

save_host_state() {
  {
    echo "ip_forward=$(cat /proc/sys/net/ipv4/ip_forward 2>/dev/null || echo 0)"
    if command -v iptables >/dev/null; then
      echo "forward_policy=$(iptables -S FORWARD 2>/dev/null | awk '/^-P FORWARD/ {print $3}')"
    fi
  } >"$SAVED"
}

warn_if_forward_drops() {
  command -v iptables >/dev/null || return 0
  if iptables -S FORWARD 2>/dev/null | grep -q '^-P FORWARD DROP'; then
    say "warning: the iptables FORWARD policy is DROP (often left behind by an earlier Docker engine);"
    say "         containers on one network cannot talk until you run: iptables -P FORWARD ACCEPT"
  fi
}

cmd_start() {
  if private_pid >/dev/null && engine_answers "unix://$SOCK"; then
    say "private engine already running (pid $(private_pid))"
    echo "export DOCKER_HOST=unix://$SOCK"; return 0
  fi
  if engine_answers ""; then
    say "an engine is already running (${DOCKER_HOST:-default socket}); not starting another"
    return 0
  fi
  install_engine
  [[ $(id -u) == 0 ]] || die "no Docker engine answers and starting one needs root; start Docker (sudo systemctl start docker) or run this script with sudo"
  mkdir -p "$STATE" "$EXEC_ROOT" "$DATA_ROOT"
  [[ -f $SAVED ]] || save_host_state
  say "starting a private engine (state in $STATE)"
  # setsid: the engine must outlive this script and not get the caller's Ctrl-C.
  setsid dockerd --data-root "$DATA_ROOT" --exec-root "$EXEC_ROOT" --pidfile "$PIDFILE" \
    -H "unix://$SOCK" --iptables=false --ip-forward=false --bridge=none \
    >"$LOG" 2>&1 </dev/null &
  local i
  for i in $(seq 1 120); do
    engine_answers "unix://$SOCK" && break
    kill -0 $! 2>/dev/null || die "dockerd exited during start; last lines of $LOG:
$(tail -n 15 "$LOG")"
    sleep 0.5
  done
  engine_answers "unix://$SOCK" || die "dockerd did not answer within 60 s; see $LOG"
  warn_if_forward_drops
  say "engine ready; use it with: export DOCKER_HOST=unix://$SOCK"
  echo "export DOCKER_HOST=unix://$SOCK"
}

delete_docker_chains() {
  # Only Docker's own chains, the jumps into them and the rules naming its bridges: other rules stay.
  local table rule chain
  for table in filter nat; do
    local jumps
    jumps=$(iptables -t "$table" -S 2>/dev/null | grep -E '^-A [A-Z]+ .*(-j DOCKER|docker0| br-[0-9a-f]{12})' | grep -vE '^-A DOCKER' || true)
    while read -r rule; do
      # shellcheck disable=SC2086  # the rule is a word list as iptables -S prints it
      [[ -n $rule ]] && { iptables -t "$table" -D ${rule#-A } 2>/dev/null || true; }
    done <<<"$jumps"
    for chain in $(iptables -t "$table" -S 2>/dev/null | awk '/^-N DOCKER/ {print $2}'); do
      iptables -t "$table" -F "$chain" 2>/dev/null || true
    done
    for chain in $(iptables -t "$table" -S 2>/dev/null | awk '/^-N DOCKER/ {print $2}'); do
      iptables -t "$table" -X "$chain" 2>/dev/null || true
    done
  done
}

remove_leftovers() {
  # What an engine leaves behind after it exits (the nsfs mount of its default netns, its runtime
  # folders); with iptables enabled it would also leave DOCKER* chains and a FORWARD DROP policy.
  umount "$EXEC_ROOT/netns/default" 2>/dev/null || true
  rm -rf "$EXEC_ROOT"
  ip link del docker0 2>/dev/null || true
  command -v iptables >/dev/null && delete_docker_chains
  if [[ -f $SAVED ]]; then
    local ip_forward="" forward_policy=""
    # shellcheck disable=SC1090
    source "$SAVED"
    [[ -n $ip_forward ]] && echo "$ip_forward" >/proc/sys/net/ipv4/ip_forward 2>/dev/null || true
    [[ -n $forward_policy ]] && command -v iptables >/dev/null && iptables -P FORWARD "$forward_policy" || true
    rm -f "$SAVED"
  fi
}

cmd_stop() {
  local purge=${1:-}
  local pid
  if ! pid=$(private_pid); then
    say "no private engine is running"
    [[ -f $SAVED || -d $EXEC_ROOT ]] || { purge_data "$purge"; return 0; }
  else
    say "stopping the private engine (pid $pid)"
    # Containers and networks of smddp jobs are removed by their scheduler; whatever is left goes now.
    local leftover
    leftover=$(docker -H "unix://$SOCK" ps -aq --filter label=ai.smddp.job 2>/dev/null || true)
    [[ -n $leftover ]] && docker -H "unix://$SOCK" rm -f $leftover >/dev/null 2>&1 || true
    kill -TERM "$pid"
    local i
    for i in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then say "dockerd still running after 30 s; killing it"; kill -KILL "$pid" || true; fi
  fi
  rm -f "$PIDFILE" "$SOCK"
  # Another engine on the machine owns its chains and bridge: leave the firewall to it.
  if DOCKER_HOST= engine_answers ""; then
    say "another engine is running; leaving the host firewall as it is"
    rm -rf "$EXEC_ROOT" "$SAVED"
  else
    remove_leftovers
  fi
  purge_data "$purge"
}

purge_data() {
  [[ ${1:-} == --purge ]] || return 0
  say "deleting the engine's data (images, build cache) in $STATE"
  rm -rf "$STATE"
}

cmd_status() {
  if pid=$(private_pid); then
    echo "private engine running: pid $pid, DOCKER_HOST=unix://$SOCK"
  elif engine_answers ""; then
    echo "an engine answers at ${DOCKER_HOST:-the default socket} (not started by this script)"
  else
    echo "no engine running"; return 1
  fi
}

case ${1:-} in
  start) cmd_start ;;
  stop) cmd_stop "${2:-}" ;;
  status) cmd_status ;;
  *) echo "usage: $0 start | stop [--purge] | status" >&2; exit 2 ;;
esac

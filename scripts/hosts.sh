#!/usr/bin/env bash
# Test hosts on one machine: K network namespaces joined by veth pairs through
# a bridge, each host's link shaped to a rate with tc tbf, a command run in
# each, and everything removed again at the end.
#
#   scripts/hosts.sh [OPTIONS] -- COMMAND [ARGS...]   run COMMAND in every host
#   scripts/hosts.sh cleanup [--all]                  remove leftovers of dead runs (--all: of every run)
#   scripts/hosts.sh list                             the namespaces of runs, live or dead
#   scripts/hosts.sh check                            exit 0 if this machine can make test hosts,
#                                                     else 77 with the reason (for tests that skip)
#   scripts/hosts.sh rsh [-OPTS...] ADDRESS COMMAND... an ssh stand-in for mpirun (plm_rsh_agent):
#                                                     runs COMMAND in the host with ADDRESS
#
# Options:
#   --hosts K          number of hosts (default 2, at most 250)
#   --rate RATE        each host's link rate in tc units (100mbit, 1gbit); default unshaped
#   --burst BYTES      tbf bucket (default: 10 ms at the rate, at least 32 KiB)
#   --queue BYTES      tbf queue limit (default: 10 ms at the rate, at least 128 KiB)
#   --subnet A.B.C     host I gets A.B.C.(I+1)/24 (default 10.77.0)
#   --on LIST          run COMMAND only on these hosts, e.g. 0 or 0,2 (default all)
#   --timeout SECONDS  wall-clock guard for the whole run (default 600); exit 124 when it fires
#   --no-prefix        do not prefix output lines with [hI]
#
# Topology: a switch namespace <run>-sw holds bridge br0 and one port hI per
# host; host namespace <run>-hI holds eth0 (the other end of hI) and lo. The
# machine's own interfaces are never touched: nothing is created in the root
# namespace, and the hosts have no route out of 10.77.0.0/24. Each host has its
# own hostname, hI, and an /etc/hosts (via /etc/netns/<run>-hI/) that names
# every host of the run.
#
# Shaping: a tbf on the host's eth0 (egress) and one on its switch port hI (the
# host's ingress), so every host has a full-duplex link of RATE each way. tbf
# counts Ethernet frames without preamble and gap, so TCP's goodput ceiling
# over MTU 1500 is 1448/1514 = 95.6% of RATE. The bucket must hold what the
# link sends while the shaper waits to be woken (its timer runs in softirq, so
# under CPU load in ksoftirqd, behind every runnable process): at 1 Gbit/s a
# 64 KiB bucket gives 55% of the rate even on an idle machine, 2 ms gives it
# there but loses 15-30% once the cores are busy (8 ranks on 2 cores), 10 ms
# keeps it (docs/results.md). A full bucket lets a link send 10 ms of data at
# once after an idle spell; the long-run rate stays RATE. The queue (tbf
# limit) holds at least one bucket; 8-10 ms lets two senders share one
# receiver's link at its full rate (2 ms loses 10-15%).
#
# COMMAND runs through `ip netns exec` and `unshare --uts` with this environment:
#   HOST=I  HOSTS=K  HOST_ADDR=A.B.C.(I+1)  HOST_ADDRS=comma list of all
#   HOSTS_SUBNET=A.B.C  HOSTS_RATE=RATE  HOSTS_NS_PREFIX=<run>-  HOSTS_SCRIPT=this script
# The run ends when every COMMAND has exited 0 (exit 0), or when the first one
# fails: then the others are stopped and the exit code is that command's.
#
# Cleanup, on any exit (success, failure, SIGINT, SIGTERM): every process in the
# run's namespaces gets SIGTERM, then SIGKILL after 5 s, and the namespaces are
# deleted (with them the bridge and the veth pairs), and so are the run's
# /etc/netns files. Names carry the script's
# pid, so runs do not collide, and `cleanup` finds the runs whose pid is dead
# (a run killed with SIGKILL cannot clean up; run `cleanup` after a crash).
set -euo pipefail

readonly kTag="lockstep-hosts"
script="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"

die() { echo "hosts: $*" >&2; exit 2; }
log() { echo "hosts: $*" >&2; }

# Every namespace of the run with this prefix ("" = of all runs).
namespaces_of() { ip netns list 2>/dev/null | awk '{print $1}' | grep "^$kTag-$1" || true; }

# Stops every process inside the namespaces with `prefix`, then deletes them.
remove_run() {
  local prefix=$1 ns pids deadline
  local all=()
  rm -rf "/etc/netns/$kTag-$prefix"*
  mapfile -t all < <(namespaces_of "$prefix")
  [ ${#all[@]} -gt 0 ] || return 0
  pids_in() { for ns in "${all[@]}"; do ip netns pids "$ns" 2>/dev/null || true; done; }
  pids=$(pids_in)
  if [ -n "$pids" ]; then
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    deadline=$((SECONDS + 5))
    while [ -n "$(pids_in)" ] && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    pids=$(pids_in)
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  fi
  for ns in "${all[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
}

cleanup_command() {
  local everything=0 ns pid prefixes
  [ "${1:-}" = "--all" ] && everything=1
  prefixes=$( (namespaces_of ""; ls /etc/netns 2>/dev/null | grep "^$kTag-" || true) |
             sed -E "s/^$kTag-([0-9]+)-.*/\1/" | sort -u)
  for pid in $prefixes; do
    if [ $everything -eq 1 ] || ! kill -0 "$pid" 2>/dev/null; then
      log "removing the namespaces of run $pid"
      remove_run "$pid-"
    fi
  done
}

check_command() {
  [ "$(id -u)" -eq 0 ] || { echo "hosts: not root" >&2; exit 77; }
  for tool in ip tc; do command -v $tool >/dev/null || { echo "hosts: $tool not found" >&2; exit 77; }; done
  local ns="$kTag-$$-check"
  trap 'ip netns del "$ns" 2>/dev/null || true' EXIT
  ip netns add "$ns" 2>/dev/null || { echo "hosts: cannot create a network namespace" >&2; exit 77; }
  ip -n "$ns" link add br0 type bridge 2>/dev/null || { echo "hosts: no bridge support" >&2; exit 77; }
  ip -n "$ns" link add chk0 type veth peer name chk1 2>/dev/null || { echo "hosts: no veth support" >&2; exit 77; }
  tc -n "$ns" qdisc add dev chk0 root tbf rate 1mbit burst 32k limit 32k 2>/dev/null ||
    { echo "hosts: no tbf qdisc" >&2; exit 77; }
  exit 0
}

# Runs a command in host namespace $1 with hostname $2 (its own UTS namespace).
enter_host() {
  local ns=$1 name=$2
  shift 2
  ip netns exec "$ns" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$name" "$@"
}

# ssh stand-in: `rsh [-x ...] ADDRESS COMMAND...` runs COMMAND (one shell line,
# as ssh would) in the host of this run that has ADDRESS (or is named hI).
rsh_command() {
  while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
  [ $# -ge 2 ] || die "rsh: usage: rsh ADDRESS COMMAND..."
  local target=$1 index
  shift
  [ -n "${HOSTS_NS_PREFIX:-}" ] || die "rsh: HOSTS_NS_PREFIX is not set (run under scripts/hosts.sh)"
  case "$target" in
    h[0-9]*) index=${target#h} ;;
    "${HOSTS_SUBNET:-10.77.0}".*) index=$((${target##*.} - 1)) ;;
    *) die "rsh: $target is not a test host address in ${HOSTS_SUBNET:-10.77.0}.0/24" ;;
  esac
  enter_host "${HOSTS_NS_PREFIX}h$index" "h$index" bash -c "$*"
  exit
}

case "${1:-}" in
  cleanup) shift; cleanup_command "$@"; exit 0 ;;
  list) namespaces_of ""; exit 0 ;;
  check) check_command ;;
  rsh) shift; rsh_command "$@" ;;
esac

hosts=2 rate="" burst="" queue="" subnet="10.77.0" on="" timeout=600 prefix_output=1
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --burst) burst=$2; shift 2 ;;
    --queue) queue=$2; shift 2 ;;
    --subnet) subnet=$2; shift 2 ;;
    --on) on=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --no-prefix) prefix_output=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$script" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[ $# -gt 0 ] || die "no command given (usage: hosts.sh [OPTIONS] -- COMMAND [ARGS...])"
[[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le 250 ] || die "--hosts $hosts: want 1..250"
[[ "$subnet" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "--subnet $subnet: want A.B.C"
[[ "$timeout" =~ ^[0-9]+$ ]] && [ "$timeout" -ge 1 ] || die "--timeout $timeout: want whole seconds >= 1"
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
if [ -z "$on" ]; then on=$(seq -s, 0 $((hosts - 1))); fi
IFS=, read -r -a run_on <<<"$on"
for i in "${run_on[@]}"; do
  [[ "$i" =~ ^[0-9]+$ ]] && [ "$i" -lt "$hosts" ] || die "--on $on: host $i is not in 0..$((hosts - 1))"
done

# Bucket and queue: 10 ms at the rate, at least 32 and 128 KiB.
if [ -n "$rate" ]; then
  bits=$(python3 - "$rate" <<'EOF'
import re, sys
m = re.fullmatch(r"([0-9.]+)([kmgt]?)(bit|bps)?", sys.argv[1].lower())
if not m: sys.exit(1)
v = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]
print(int(v * (8 if m.group(3) == "bps" else 1)))
EOF
  ) || die "--rate $rate: want a number with kbit, mbit, gbit (or bps)"
  if [ -z "$burst" ]; then burst=$((bits / 8 / 100)); [ "$burst" -ge 32768 ] || burst=32768; fi
  if [ -z "$queue" ]; then queue=$((bits / 8 / 100)); [ "$queue" -ge 131072 ] || queue=131072; fi
fi

run="$kTag-$$-"
ns_sw="${run}sw"
ns_host() { echo "${run}h$1"; }
addr() { echo "$subnet.$(($1 + 1))"; }
addrs=$(for ((i = 0; i < hosts; i++)); do addr $i; done | paste -sd,)

children=()
on_exit() {
  local rc=$?
  # Ignored, not reset: a second signal (timeout(1) signals the whole process
  # group) must not kill the tools that clean up.
  trap '' INT TERM
  trap - EXIT
  for p in "${children[@]}"; do kill "$p" 2>/dev/null || true; done
  remove_run "$$-"
  wait 2>/dev/null || true
  exit $rc
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The switch: a bridge in its own namespace.
ip netns add "$ns_sw"
ip -n "$ns_sw" link add br0 type bridge
ip -n "$ns_sw" link set br0 up
ip -n "$ns_sw" link set lo up
for ((i = 0; i < hosts; i++)); do
  ns=$(ns_host $i)
  # `ip netns exec` mounts /etc/netns/NS/hosts over /etc/hosts: hI resolves.
  mkdir -p "/etc/netns/$ns"
  { echo "127.0.0.1 localhost"; for ((j = 0; j < hosts; j++)); do echo "$(addr $j) h$j"; done; } \
    > "/etc/netns/$ns/hosts"
  ip netns add "$ns"
  ip -n "$ns_sw" link add "h$i" type veth peer name eth0 netns "$ns"
  ip -n "$ns_sw" link set "h$i" master br0
  ip -n "$ns_sw" link set "h$i" up
  ip -n "$ns" addr add "$(addr $i)/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  if [ -n "$rate" ]; then
    tc -n "$ns" qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" limit "$queue"
    tc -n "$ns_sw" qdisc replace dev "h$i" root tbf rate "$rate" burst "$burst" limit "$queue"
  fi
done
log "up: $hosts hosts ${run}h0..h$((hosts - 1)), addresses $(addr 0)..$(addr $((hosts - 1))), rate ${rate:-unshaped}${rate:+ (tbf burst $burst, queue $queue)}"

# The wall-clock guard is one more child, in the switch namespace so that
# cleanup finds it even after a SIGKILL; whichever child ends first decides.
ip netns exec "$ns_sw" sleep "$timeout" &
guard=$!
children+=("$guard")
declare -A host_of=()
for i in "${run_on[@]}"; do
  envs=(HOST="$i" HOSTS="$hosts" HOST_ADDR="$(addr "$i")" HOST_ADDRS="$addrs" HOSTS_SUBNET="$subnet"
        HOSTS_RATE="$rate" HOSTS_NS_PREFIX="$run" HOSTS_SCRIPT="$script")
  if [ $prefix_output -eq 1 ]; then
    enter_host "$(ns_host "$i")" "h$i" env "${envs[@]}" "$@" \
      > >(sed -u "s/^/[h$i] /") 2> >(sed -u "s/^/[h$i] /" >&2) &
  else
    enter_host "$(ns_host "$i")" "h$i" env "${envs[@]}" "$@" &
  fi
  host_of[$!]=$i
  children+=($!)
done

running=("${!host_of[@]}")
while [ ${#running[@]} -gt 0 ]; do
  rc=0
  finished=""
  wait -n -p finished "$guard" "${running[@]}" || rc=$?
  if [ "$finished" = "$guard" ]; then
    log "timed out after $timeout s with ${#running[@]} host(s) still running; stopping them"
    exit 124
  fi
  [ -n "$finished" ] || exit "$rc"  # interrupted
  if [ $rc -ne 0 ]; then
    log "host ${host_of[$finished]} exited with $rc first; stopping the others"
    exit $rc
  fi
  mapfile -t running < <(printf '%s\n' "${running[@]}" | grep -vx "$finished")
done
exit 0

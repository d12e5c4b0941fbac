#!/bin/sh
# Usage: run_processes.sh PROGRAM N [FLAGS...]
#
# Starts N processes of PROGRAM (custom_loop) as one Gloo group on this host:
# rank r gets RANK=r, WORLD_SIZE=N and a file rendezvous in a fresh directory,
# as each host's command would across machines (there, LOCKSTEP_RENDEZVOUS=
# redis://HOST:PORT and a secret file: docs/multi-machine.md). Waits for all;
# exits non-zero if any rank did. Under mpirun, --backend mpi needs none of it:
#   mpirun -np N PROGRAM --backend mpi
set -u
program=$1 n=$2
shift 2
case $n in
  '' | *[!0-9]* | 0) echo "run_processes.sh: N must be a number of processes, 1 or more, not '$n'" >&2; exit 2 ;;
esac
dir=$(mktemp -d)
pids=""
# Ctrl-C or a kill reaches this script; its background ranks ignore SIGINT
# (a non-interactive shell starts them so): stop them, and keep no directory.
trap 'rm -rf "$dir"' EXIT
trap 'kill $pids 2>/dev/null; rm -rf "$dir"; exit 130' INT
trap 'kill $pids 2>/dev/null; rm -rf "$dir"; exit 143' TERM
trap 'kill $pids 2>/dev/null; rm -rf "$dir"; exit 129' HUP
r=0
while [ "$r" -lt "$n" ]; do
  RANK=$r WORLD_SIZE=$n LOCKSTEP_RENDEZVOUS="file:$dir" "$program" --backend gloo "$@" &
  pids="$pids $!"
  r=$((r + 1))
done
status=0
for pid in $pids; do
  wait "$pid" || status=1
done
if [ "$status" -eq 0 ]; then echo "run_processes.sh: all $n ranks exited 0"; fi
exit $status

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
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pids=""
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
exit $status

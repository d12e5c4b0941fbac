#!/usr/bin/env bash
# Peer comparison, run by hand (never in CI): the same all-reduce sweep with
# lockstep (8 in-process replicas, algorithm auto), OpenMPI's MPI_Allreduce
# (8 processes, oversubscribed on this machine's cores) and Gloo's
# AllreduceRingChunked and AllreduceHalvingDoubling (8 processes over TCP on
# loopback, file-store rendezvous). Prints median microseconds per call and
# lockstep's speed-up over the faster peer. Usage: bench/peers/compare.sh [SIZES...]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="$root/build/peers"
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(4096 16384 65536 262144 1048576 4194304 16777216 67108864)

"$root/scripts/setup.sh"
"$root/bench/peers/need_packages.sh" openmpi-bin libopenmpi-dev libgloo-dev jq
"$root/scripts/build.sh" >/dev/null
mkdir -p "$out"
mpicxx -O2 -std=c++17 "$root/bench/peers/mpi_allreduce.cpp" -o "$out/mpi_allreduce"
g++ -O2 -std=c++17 "$root/bench/peers/gloo_allreduce.cpp" -o "$out/gloo_allreduce" -lgloo -pthread

results="$out/results.jsonl"
: > "$results"
csv=$(IFS=,; echo "${sizes[*]}")
"$root/build/cli/lockstep" bench allreduce --replicas 8 --sizes "$csv" --json |
  jq -c '.[] | {peer: "lockstep", algorithm: .algorithm, bytes: .bytes, time_us: .time_us}' >> "$results"
mpirun --allow-run-as-root --oversubscribe -np 8 "$out/mpi_allreduce" "${sizes[@]}" >> "$results"
store=$(mktemp -d)
pids=()
for r in 0 1 2 3 4 5 6 7; do
  if [ "$r" -eq 0 ]; then
    "$out/gloo_allreduce" "$r" 8 "$store" "${sizes[@]}" >> "$results" & pids+=($!)
  else
    "$out/gloo_allreduce" "$r" 8 "$store" "${sizes[@]}" > /dev/null & pids+=($!)
  fi
done
for p in "${pids[@]}"; do wait "$p"; done
rm -rf "$store"

printf '%12s %12s %14s %14s %14s %10s\n' bytes lockstep_us openmpi_us gloo_ring_us gloo_hd_us speedup
for s in "${sizes[@]}"; do
  t() { jq -r --arg p "$1" --arg a "$2" --argjson b "$s" \
          'select(.peer == $p and (.algorithm == $a or $a == "") and .bytes == $b) | .time_us' "$results" | head -1; }
  ours=$(t lockstep ""); mpi=$(t openmpi MPI_Allreduce); ring=$(t gloo AllreduceRingChunked); hd=$(t gloo AllreduceHalvingDoubling)
  speed=$(jq -n --argjson o "$ours" --argjson m "$mpi" --argjson r "$ring" --argjson h "$hd" \
            '([$m, $r, $h] | min) / $o | . * 10 | round / 10')
  printf '%12s %12.1f %14.1f %14.1f %14.1f %9sx\n' "$s" "$ours" "$mpi" "$ring" "$hd" "$speed"
done
echo "raw results: $results"

#!/usr/bin/env bash
# The multi-host all-reduce bar (issue 7): test hosts on shaped links
# (scripts/hosts.sh), ranks spread over them, and one size timed three ways:
#   lockstep auto   `lockstep bench allreduce --backend gloo --algorithm auto`: what lockstep chooses, the
#                   hierarchical all-reduce when ranks share hosts (a ring inside each host, rings across)
#   lockstep ring   the same with --algorithm ring (one flat ring over Gloo's TCP pairs)
#   gloo native     the same command with --algorithm native (Gloo's own all-reduce)
#   openmpi         MPI_Allreduce (bench/peers/mpi_allreduce.cpp) under mpirun, which starts its daemons
#                   in the other hosts through `scripts/hosts.sh rsh` (an ssh stand-in)
#   openmpi ring    the same with OpenMPI's ring all-reduce forced (coll_tuned_allreduce_algorithm 4);
#                   the bar takes the faster of the two
# The Gloo ranks meet at a redis-server started in host 0, and prove a shared
# secret to each other. Run by hand as root, never in CI.
#
#   bench/hosts_allreduce.sh [--hosts 4] [--per-host 2] [--rate 1gbit] [--size 64M] [--runs 3]
#                            [--repeats N] [--out DIR] [--no-build] [--impls ring,native,...]
# --rate none leaves the links unshaped: what the machine's cores allow.
#
# Each run starts fresh hosts for each implementation, in the order given by
# --impls (default auto, ring, native, openmpi, openmpi ring); the table shows the median of the runs and each run's
# times. busbw = 2 (N-1)/N x bytes / time, as nccl-tests: for a ring it is the
# rate each host's link carries, so the bar compares it with the link rate:
# ours >= 0.85 of it, and at least as fast as both peers.
# Uses $LOCKSTEP_BUILD_DIR (default build/); builds lockstep and the MPI peer.
set -euo pipefail
# shellcheck source=SCRIPTDIR/hosts_common.sh
source "$(dirname "$0")/hosts_common.sh"  # root, build, lockstep, redis_port; hosts_* steps
mpi_peer="$build/peers/mpi_allreduce"

# --- inside a test host (hosts.sh runs this script again with __host) -------
if [ "${1:-}" = "__host" ]; then
  what=$1 impl=$2 per_host=$3 size=$4 repeats=$5 out=$6
  world=$((HOSTS * per_host))
  if [ "$impl" = openmpi ] || [ "$impl" = openmpi_ring ]; then
    forced=()
    [ "$impl" = openmpi ] || forced=(--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4)
    slots=$(for ((h = 0; h < HOSTS; h++)); do printf 'h%d:%d,' $h "$per_host"; done)
    bytes=$(python3 -c "import sys; s=sys.argv[1].upper().rstrip('IB'); m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$size")
    # 8 ranks on this machine's 2 cores: without yield_when_idle every waiting
    # rank spins and MPI_Allreduce takes ~10x longer.
    exec mpirun --allow-run-as-root -np "$world" --host "${slots%,}" \
      --mca plm_rsh_agent "$HOSTS_SCRIPT rsh" --mca mpi_yield_when_idle 1 \
      --mca btl tcp,self,vader --mca btl_tcp_if_include "$HOSTS_SUBNET.0/24" \
      --mca oob_tcp_if_include "$HOSTS_SUBNET.0/24" "${forced[@]}" \
      "$mpi_peer" "$bytes" > "$out/result.jsonl" 2> "$out/mpirun.log"
  fi
  hosts_start_redis "$out"
  # shellcheck disable=SC2317  # called by hosts_run_ranks
  run_rank() {  # RANK: rank 0's result to result.json
    local rank=$1 target=/dev/null
    [ "$rank" -ne 0 ] || target="$out/result.json"
    "$lockstep" bench allreduce --backend gloo --algorithm "$impl" --sizes "$size" --json \
      ${repeats:+--repeats "$repeats"} --timeout 120 > "$target" 2> "$out/rank$rank.log"
  }
  rc=0
  hosts_run_ranks "$per_host" "$out" run_rank || rc=$?
  exit $rc
fi

# --- the driver -------------------------------------------------------------
hosts=4 per_host=2 rate=1gbit size=64M runs=3 repeats="" out="" build_first=1
impl_list=auto,ring,native,openmpi,openmpi_ring
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --per-host) per_host=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-build) build_first=0; shift ;;
    --impls) impl_list=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "hosts_allreduce: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || out="$build/hosts_allreduce"
hosts_prepare "$out" "$build_first"
if [ ! -x "$mpi_peer" ] || [ "$root/bench/peers/mpi_allreduce.cpp" -nt "$mpi_peer" ]; then
  mkdir -p "$(dirname "$mpi_peer")"
  mpicxx -O2 -std=c++17 "$root/bench/peers/mpi_allreduce.cpp" -o "$mpi_peer"
fi

IFS=, read -r -a impls <<< "$impl_list"
for ((r = 0; r < runs; r++)); do
  for impl in "${impls[@]}"; do
    dir="$out/run$r-$impl"
    mkdir -p "$dir"
    cp "$out/secret" "$dir/secret"
    on=""; [ "${impl#openmpi}" = "$impl" ] || on="--on 0"
    shaping=""; [ "$rate" = none ] || shaping="--rate $rate"
    # shellcheck disable=SC2086
    if ! "$root/scripts/hosts.sh" --hosts "$hosts" $shaping $on --timeout 600 -- \
         "$0" __host "$impl" "$per_host" "$size" "$repeats" "$dir" > "$dir/hosts.log" 2>&1; then
      echo "hosts_allreduce: run $r, $impl failed; see $dir" >&2
      exit 1
    fi
    echo "run $r $impl: $(cat "$dir"/result.json* | tr -d '\n ' | cut -c1-160)" >&2
  done
done

python3 - "$out" "$runs" "$hosts" "$per_host" "$rate" "$size" "$impl_list" <<'EOF'
import json, re, statistics, sys
out, runs, hosts, per_host, rate, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
n = hosts * per_host
m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", rate.lower())
link = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] if m else None
def result(run, impl):
    if impl.startswith("openmpi"):
        row = json.loads(open(f"{out}/run{run}-{impl}/result.jsonl").readline())
    else:
        row = json.load(open(f"{out}/run{run}-{impl}/result.json"))[0]
    return row["bytes"], row["time_us"] / 1e6
names = {"auto": "lockstep auto", "hierarchical": "lockstep hierarchical", "ring": "lockstep ring (gloo pairs)", "native": "gloo native", "openmpi": "openmpi MPI_Allreduce",
         "openmpi_ring": "openmpi, ring forced"}
print(f"all-reduce (float sum) of {size} per rank: {hosts} hosts x {per_host} ranks, "
      + (f"links {rate} each way (tbf)" if link else "links unshaped") + f", {runs} runs")
print(f"{'implementation':<28} {'time_ms':>9} {'busbw_Gbit/s':>13} {'of_link':>8}   runs (time_ms)")
med = {}
for impl in [i for i in ("auto", "hierarchical", "ring", "native", "openmpi", "openmpi_ring")
             if i in sys.argv[7].split(",")]:
    times = [result(r, impl)[1] for r in range(runs)]
    nbytes = result(0, impl)[0]
    t = statistics.median(times)
    busbw = 2 * (n - 1) / n * nbytes * 8 / t
    med[impl] = (t, busbw)
    print(f"{names[impl]:<28} {t * 1e3:9.1f} {busbw / 1e9:13.3f} {busbw / link if link else 0:8.3f}   "
          + " ".join(f"{x * 1e3:.1f}" for x in times))
ours_name = "auto" if "auto" in med else "ring"
if {ours_name, "native", "openmpi", "openmpi_ring"} <= med.keys():
    ours = med[ours_name]
    ok_link = link is not None and ours[1] >= 0.85 * link
    mpi = min(med["openmpi"][0], med["openmpi_ring"][0])
    ok_peers = ours[0] <= min(med["native"][0], mpi)
    print(f"bar (ours = {names[ours_name]}): busbw >= 0.85 of the link: {'yes' if ok_link else 'NO'} ({ours[1] / link if link else 0:.3f}); "
          f"at least as fast as gloo native and openmpi: {'yes' if ok_peers else 'NO'} "
          f"(x{med['native'][0] / ours[0]:.2f}, x{mpi / ours[0]:.2f})")
EOF

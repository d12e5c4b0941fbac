#!/usr/bin/env bash
# The cost model against our own measured runs (docs/cost-model.md,
# "Validation against our runs"). Run by hand on a quiet machine, never in CI.
#
# For each configuration: one `lockstep train` run over the modelled link,
# then `lockstep plan` for the same model, replicas, micro-batch, link and
# buckets. The plan's compute comes from a separate run of the same model,
# replicas and micro-batch WITHOUT a link (its in-memory all-reduce costs
# well under a millisecond): the plan is told that the N replicas share this
# machine's C cores (--host-cores C) and that one replica, with a core of its
# own, computes a step in T = that run's step time x C/N (for N > C; its step
# time for N <= C). So what is tested is the link, the all-reduce algorithm,
# the buckets' overlap and the sharing of cores, not our CPU's FLOP/s or what
# N copies of the model do to its caches. The host's cost per message hand-off
# (--host-latency) is measured once, by a 4 KiB ring all-reduce over 2C
# replicas, two per core, so that every hand-off is a context switch as in
# the shared runs: its time / its 2(2C-1) rounds / 2 replicas per core. Prints a markdown
# table: measured and predicted step time and exposed communication, and the
# step-time error (target: within 15%).
#
# Every measurement is the median of RUNS runs (default 3), the runs with and
# without the link interleaved.
#
# The last field of a configuration is the ZeRO stage (--zero 0 or 1, for
# both train and plan). FILTER, a regular expression, keeps only the
# configurations it matches (FILTER=' 1$': the --zero 1 ones).
#
# Usage: [RUNS=3] [FILTER=regex] bench/validate_plan.sh [LOCKSTEP_BINARY]   (default build/cli/lockstep)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
lockstep="${1:-$root/build/cli/lockstep}"
runs="${RUNS:-3}"
out="$root/build/validate_plan"
mkdir -p "$out"
command -v jq >/dev/null || { echo "validate_plan.sh needs jq (apt-get install jq)" >&2; exit 1; }

# hidden  replicas  micro-batch  link  bucket-mb  zero
configs=(
  "512,512 2 32 1Gbit 25 0"
  "512,512 2 32 1Gbit 0 0"
  "512,512 4 32 10Gbit 25 0"
  "512,512 4 32 10Gbit 0 0"
  "512,512 8 32 10Gbit 25 0"
  "512,512 8 32 10Gbit 0 0"
  "512,512 8 16 100Gbit 25 0"
  "512,512 8 128 100Gbit 25 0"
  "512,512 4 128 1Gbit 25 0"
  "512,512 4 64 1Gbit 0 0"
  "512,512 2 128 100Gbit 0 0"
  "1024,1024,1024 8 64 10Gbit 25 0"
  "1024,1024,1024 4 16 10Gbit 25 0"
  "1024,1024,1024 2 64 1Gbit 0 0"
  "512,512 2 32 1Gbit 25 1"
  "512,512 4 32 10Gbit 25 1"
  "512,512 8 32 10Gbit 25 1"
  "512,512 4 128 1Gbit 25 1"
  "1024,1024,1024 4 16 10Gbit 25 1"
  "1024,1024,1024 2 64 1Gbit 0 1"
)

cores=$(nproc)
if [ "$cores" -lt 2 ]; then echo "validate_plan.sh needs at least 2 cores" >&2; exit 1; fi
ring_us=$("$lockstep" bench allreduce --algorithm ring --sizes 4K --replicas $((2 * cores)) --repeats 200 \
  --json | jq '.[0].time_us')
host_us=$(jq -n "$ring_us / (2 * (2 * $cores - 1)) / 2")
printf "host: %s cores; a 4 KiB ring all-reduce over %s replicas takes %.1f us: --host-latency %.1fus\n\n" \
  "$cores" $((2 * cores)) "$ring_us" "$host_us"
echo "| hidden | replicas | micro-batch | link | bucket MiB | zero | compute ms, a core each | measured step ms (median) | predicted step ms | error | measured exposed ms | predicted exposed ms |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
declare -A t1  # compute per step of a replica with a core of its own, by "hidden replicas micro-batch"
median() { jq -s 'sort | .[length / 2 | floor]'; }
worst=0
for c in "${configs[@]}"; do
  [[ "$c" =~ ${FILTER:-.} ]] || continue
  read -r hidden n b link bucket zero <<<"$c"
  key="$hidden $n $b"
  steps=() exposeds=() locals=()
  for ((i = 0; i < runs; i++)); do
    if [ -z "${t1[$key]:-}" ]; then
      local_run="$out/nolink-${hidden//,/x}-$n-$b-$i.json"
      "$lockstep" train --hidden "$hidden" --replicas "$n" --micro-batch "$b" --steps 100 --report "$local_run" \
        --quiet >/dev/null
      locals+=("$(jq '.timing.step_ms' "$local_run")")
    fi
    report="$out/r-${hidden//,/x}-$n-$b-$link-$bucket-$zero-$i.json"
    "$lockstep" train --hidden "$hidden" --replicas "$n" --micro-batch "$b" --link-bandwidth "$link" \
      --link-latency 50us --bucket-mb "$bucket" --zero "$zero" --steps 40 --report "$report" --quiet >/dev/null
    steps+=("$(jq '.timing.step_ms' "$report")")
    exposeds+=("$(jq '.timing.exposed_comm_ms' "$report")")
  done
  if [ -z "${t1[$key]:-}" ]; then
    t1[$key]=$(printf '%s\n' "${locals[@]}" | median |
      jq --argjson n "$n" --argjson c "$cores" '. * (if $n > $c then $c / $n else 1 end)')
  fi
  step=$(printf '%s\n' "${steps[@]}" | median)
  exposed=$(printf '%s\n' "${exposeds[@]}" | median)
  plan=$("$lockstep" plan --hidden "$hidden" --replicas "$n" --micro-batch "$b" --link-bandwidth "$link" \
    --link-latency 50us --bucket-mb "$bucket" --zero "$zero" --algorithm auto --compute-ms "${t1[$key]}" \
    --host-cores "$cores" --host-latency "${host_us}us" --json)
  p_step=$(jq '.rows[0].step_ms' <<<"$plan")
  p_exposed=$(jq '.rows[0].exposed_comm_ms' <<<"$plan")
  err=$(jq -n "($p_step - $step) / $step * 100")
  worst=$(jq -n "[($err | if . < 0 then -. else . end), $worst] | max")
  printf "| %s | %s | %s | %s | %s | %s | %.2f | %.2f | %.2f | %+.1f%% | %.2f | %.2f |\n" \
    "$hidden" "$n" "$b" "$link" "$bucket" "$zero" "${t1[$key]}" "$step" "$p_step" "$err" "$exposed" "$p_exposed"
done
printf "\nworst step-time error: %.1f%% (target: 15%%)\n" "$worst"

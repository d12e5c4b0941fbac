#!/usr/bin/env bash
# The cost model against our own measured runs (docs/cost-model.md,
# "Validation against our runs"). Run by hand on a quiet machine, never in CI.
#
# For each configuration: one `lockstep train` run over the modelled link,
# then `lockstep plan` for the same model, replicas, micro-batch, link and
# buckets, with --compute-ms set to the run's own measured compute per step
# (so the comparison tests the communication and overlap terms, not our CPU's
# FLOP/s). Prints a markdown table: measured and predicted step time and
# exposed communication, and the step-time error (target: within 15%).
#
# Usage: bench/validate_plan.sh [LOCKSTEP_BINARY]   (default build/cli/lockstep)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
lockstep="${1:-$root/build/cli/lockstep}"
out="$root/build/validate_plan"
mkdir -p "$out"
command -v jq >/dev/null || { echo "validate_plan.sh needs jq (apt-get install jq)" >&2; exit 1; }

# hidden  replicas  micro-batch  link  bucket-mb
configs=(
  "512,512 2 32 1Gbit 25"
  "512,512 2 32 1Gbit 0"
  "512,512 4 32 10Gbit 25"
  "512,512 4 32 10Gbit 0"
  "512,512 8 32 10Gbit 25"
  "512,512 8 32 10Gbit 0"
  "512,512 8 16 100Gbit 25"
  "512,512 8 128 100Gbit 25"
  "512,512 4 128 1Gbit 25"
  "512,512 4 64 1Gbit 0"
  "512,512 2 128 100Gbit 0"
  "1024,1024,1024 8 64 10Gbit 25"
  "1024,1024,1024 4 16 10Gbit 25"
  "1024,1024,1024 2 64 1Gbit 0"
)

echo "| hidden | replicas | micro-batch | link | bucket MiB | measured step ms | predicted step ms | error | measured exposed ms | predicted exposed ms |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
worst=0
for c in "${configs[@]}"; do
  read -r hidden n b link bucket <<<"$c"
  report="$out/r-${hidden//,/x}-$n-$b-$link-$bucket.json"
  "$lockstep" train --hidden "$hidden" --replicas "$n" --micro-batch "$b" --link-bandwidth "$link" \
    --link-latency 50us --bucket-mb "$bucket" --steps 40 --report "$report" --quiet >/dev/null
  step=$(jq '.timing.step_ms' "$report")
  compute=$(jq '.timing.compute_ms' "$report")
  exposed=$(jq '.timing.exposed_comm_ms' "$report")
  plan=$("$lockstep" plan --hidden "$hidden" --replicas "$n" --micro-batch "$b" --link-bandwidth "$link" \
    --link-latency 50us --bucket-mb "$bucket" --algorithm auto --compute-ms "$compute" --json)
  p_step=$(jq '.rows[0].step_ms' <<<"$plan")
  p_exposed=$(jq '.rows[0].exposed_comm_ms' <<<"$plan")
  err=$(jq -n "($p_step - $step) / $step * 100")
  worst=$(jq -n "[($err | if . < 0 then -. else . end), $worst] | max")
  printf "| %s | %s | %s | %s | %s | %.2f | %.2f | %+.1f%% | %.2f | %.2f |\n" \
    "$hidden" "$n" "$b" "$link" "$bucket" "$step" "$p_step" "$err" "$exposed" "$p_exposed"
done
printf "\nworst step-time error: %.1f%% (target: 15%%)\n" "$worst"

#!/usr/bin/env bash
# Training across test hosts against `lockstep plan`'s prediction for that
# topology (issue 7's third bar). `lockstep train --backend gloo` runs as
# HOSTS x PER_HOST ranks in test hosts on shaped links (scripts/hosts.sh),
# meeting at a redis-server in host 0; rank 0's report (--report) gives the
# measured step time, and `lockstep plan --per-node PER_HOST --replicas HOSTS x PER_HOST`
# with the same link and all-reduce predicts it three times: from its own
# device model; with the compute time the run measured (--compute-ms), which
# isolates the communication model; and with the ranks sharing this
# machine's cores (--host-cores $(nproc)), as they do. Run by hand as root, never in CI.
#
#   bench/hosts_train.sh [--hosts 4] [--per-host 2] [--rate 1gbit] [--steps 300] [--algorithm ring]
#                        [--out DIR] [--no-build] [-- EXTRA TRAIN FLAGS]
# --algorithm (ring, halving_doubling or tree) goes to both train and plan.
# Uses $LOCKSTEP_BUILD_DIR (default build/).
set -euo pipefail
# shellcheck source=SCRIPTDIR/hosts_common.sh
source "$(dirname "$0")/hosts_common.sh"  # root, build, lockstep, redis_port; hosts_* steps

# --- inside a test host ------------------------------------------------------
if [ "${1:-}" = "__host" ]; then
  per_host=$2 steps=$3 out=$4
  shift 4
  train_flags=("$@")
  hosts_start_redis "$out"
  # shellcheck disable=SC2317  # called by hosts_run_ranks
  run_rank() {  # RANK
    local rank=$1
    "$lockstep" train --backend gloo --steps "$steps" --quiet --report "$out/report.rank$rank.json" \
      "${train_flags[@]}" > "$out/rank$rank.log" 2>&1
  }
  rc=0
  hosts_run_ranks "$per_host" "$out" run_rank || rc=$?
  exit $rc
fi

# --- the driver ----------------------------------------------------------------
hosts=4 per_host=2 rate=1gbit steps=300 algorithm=ring out="" build_first=1
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --per-host) per_host=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --algorithm) algorithm=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-build) build_first=0; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "hosts_train: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || out="$build/hosts_train"
hosts_prepare "$out" "$build_first"

if ! "$root/scripts/hosts.sh" --hosts "$hosts" --rate "$rate" --timeout 900 -- \
     "$0" __host "$per_host" "$steps" "$out" --algorithm "$algorithm" "$@" > "$out/hosts.log" 2>&1; then
  echo "hosts_train: the run failed; see $out" >&2
  exit 1
fi

link=$(python3 -c "import re,sys; m=re.fullmatch(r'([0-9.]+)([kmg]?)bit', sys.argv[1].lower()); \
print(m.group(1) + {'': '', 'k': 'K', 'm': 'M', 'g': 'G'}[m.group(2)] + 'bit')" "$rate")
read -r step compute comm exposed <<<"$(python3 -c "
import json, sys
t = json.load(open(sys.argv[1]))['timing']
print(t['step_ms'], t['compute_ms'], t['comm_ms'], t['exposed_comm_ms'])
" "$out/report.rank0.json")"
plan_args=(--per-node "$per_host" --replicas $((hosts * per_host)) --link-bandwidth "$link"
           --algorithm "$algorithm")
predicted() { "$lockstep" plan "${plan_args[@]}" "$@" --json | python3 -c "
import json, sys
p = json.load(sys.stdin)
dp = [a for a in p['alternatives'] if a['name'] == 'data parallel'][0]
print(f\"{dp['step_ms']:.2f}\")"; }
own=$(predicted)
with_compute=$(predicted --compute-ms "$compute")
cores=$(nproc)
shared=$(predicted --host-cores "$cores")
echo "lockstep train --backend gloo: $hosts hosts x $per_host ranks, links $rate (tbf), $steps steps, algorithm $algorithm"
printf '%-48s %10s\n' "" step_ms
printf '%-48s %10.2f   (compute %.2f, comm %.2f, exposed %.2f)\n' "measured (rank 0's report, median step)" \
  "$step" "$compute" "$comm" "$exposed"
printf '%-48s %10.2f   (ratio measured/predicted %.2f)\n' "plan, its own compute model" "$own" \
  "$(python3 -c "print($step / $own)")"
printf '%-48s %10.2f   (ratio measured/predicted %.2f)\n' "plan, with the measured compute (--compute-ms)" \
  "$with_compute" "$(python3 -c "print($step / $with_compute)")"
printf '%-48s %10.2f   (ratio measured/predicted %.2f)\n' "plan, the ranks sharing $cores cores (--host-cores)" \
  "$shared" "$(python3 -c "print($step / $shared)")"
echo "plan: lockstep plan ${plan_args[*]} [--compute-ms $compute | --host-cores $cores]"

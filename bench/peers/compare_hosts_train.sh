#!/usr/bin/env bash
# Training across test hosts beside PyTorch DDP, run by hand as root (never in CI). HOSTS x
# PER_HOST ranks in test hosts on shaped links (scripts/hosts.sh; default 4 x 2 at 1 Gbit/s, the
# topology of issue 7) run lockstep train's default job (Fashion-MNIST, MLP 784-512-512-10, SGD
# with momentum, cosine; micro-batch 32) in five arms, interleaved, REPEATS times:
#   lockstep ring     lockstep train --backend gloo --algorithm ring (the all-reduce DDP's Gloo runs)
#   lockstep auto     the same with its default algorithm (hierarchical on these hosts)
#   lockstep bf16     auto with --compress bf16 (bf16 on the wire, error feedback)
#   ddp               PyTorch DDP, Gloo backend (bench/peers/ddp_train.py)
#   ddp fp16          DDP with its fp16_compress_hook (half the bytes; its bf16 hook needs CUDA)
# Prints the median samples/s of each arm and its ratio to DDP (lockstep bf16 to DDP fp16).
# lockstep's samples/s count every step (its report), DDP's leave out 10 warm-up steps.
#
#   bench/peers/compare_hosts_train.sh [--repeats 3] [--steps 300] [--hosts 4] [--per-host 2]
#                                      [--rate 1gbit] [--out DIR] [--no-build]
# Uses $LOCKSTEP_BUILD_DIR (default build/).
set -euo pipefail
# shellcheck source=SCRIPTDIR/../hosts_common.sh
source "$(dirname "$0")/../hosts_common.sh"  # root, build, lockstep, redis_port; hosts_* steps
ddp_port=29500

# --- inside a test host ------------------------------------------------------
if [ "${1:-}" = "__host" ]; then
  arm=$2 per_host=$3 steps=$4 out=$5
  if [ "${arm%% *}" = ddp ]; then
    compress=none; [ "$arm" = "ddp fp16" ] && compress=fp16
    result=/dev/null; [ "$HOST" = 0 ] && result="$out/result.json"
    GLOO_SOCKET_IFNAME=eth0 /usr/bin/python3 "$root/bench/peers/ddp_train.py" --nproc "$per_host" \
      --first-rank $((HOST * per_host)) --world-size $((HOSTS * per_host)) \
      --master "${HOST_ADDRS%%,*}:$ddp_port" --steps "$steps" --compress "$compress" > "$result"
    exit 0
  fi
  flags=(); case "$arm" in
    "lockstep ring") flags=(--algorithm ring) ;;
    "lockstep bf16") flags=(--compress bf16) ;;
  esac
  hosts_start_redis "$out"
  # shellcheck disable=SC2317  # called by hosts_run_ranks
  run_rank() {  # RANK
    "$lockstep" train --backend gloo --steps "$steps" --quiet --report "$out/report.rank$1.json" \
      "${flags[@]}" > "$out/rank$1.log" 2>&1
  }
  rc=0
  hosts_run_ranks "$per_host" "$out" run_rank || rc=$?
  [ "$HOST" != 0 ] || [ $rc -ne 0 ] || jq -c '{samples_per_s}' "$out/report.rank0.json" > "$out/result.json"
  exit $rc
fi

# --- the driver ----------------------------------------------------------------
repeats=3 steps=300 hosts=4 per_host=2 rate=1gbit out="" build_first=1
while [ $# -gt 0 ]; do
  case "$1" in
    --repeats) repeats=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --per-host) per_host=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-build) build_first=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "compare_hosts_train: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || out="$build/peers/hosts_train"
"$root/bench/peers/need_packages.sh" python3-torch jq redis-server
hosts_prepare "$out" "$build_first"
arms=("lockstep ring" "lockstep auto" "lockstep bf16" "ddp" "ddp fp16")
results="$out/results.jsonl"
: > "$results"
for ((r = 1; r <= repeats; r++)); do
  for arm in "${arms[@]}"; do
    echo "repeat $r/$repeats: $arm" >&2
    run="$out/run"; rm -rf "$run"; mkdir -p "$run"; cp "$out/secret" "$run/secret"
    if ! "$root/scripts/hosts.sh" --hosts "$hosts" --rate "$rate" --timeout 900 -- \
         "$0" __host "$arm" "$per_host" "$steps" "$run" > "$run/hosts.log" 2>&1; then
      echo "compare_hosts_train: the $arm run failed; see $run" >&2
      exit 1
    fi
    jq -c --arg arm "$arm" '{arm: $arm, samples_per_s}' "$run/result.json" >> "$results"
  done
done
median() {  # ARM
  jq -s --arg a "$1" '[.[] | select(.arm == $a) | .samples_per_s] | sort
    | (.[(length - 1) / 2 | floor] + .[length / 2 | floor]) / 2' "$results"
}
echo "$hosts hosts x $per_host ranks, links $rate (tbf), 8 x 32 per step, $steps steps; samples/s, median of $repeats"
printf '%-16s %12s %10s\n' arm samples/s vs_ddp
ddp=$(median ddp) ddp_fp16=$(median "ddp fp16")
for arm in "${arms[@]}"; do
  m=$(median "$arm") base=$ddp
  case "$arm" in *bf16 | *fp16) base=$ddp_fp16 ;; esac
  printf '%-16s %12.0f %9.2fx\n' "$arm" "$m" "$(jq -n --argjson a "$m" --argjson b "$base" '$a / $b')"
done
echo "raw results: $results"

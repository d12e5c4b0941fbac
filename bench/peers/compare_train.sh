#!/usr/bin/env bash
# Training throughput beside PyTorch DDP, run by hand (never in CI). The same job on the same data
# (lockstep train's defaults: Fashion-MNIST, MLP 784-512-512-10, SGD with momentum, cosine) as
# 8 x 32, 2 x 128 and 1 x 256:
#   lockstep, in-process replicas (the default backend);
#   lockstep, one process per replica over Gloo/TCP on loopback (lockstep launch);
#   lockstep, one process per replica over OpenMPI (shared memory on one host);
#   PyTorch DDP (Debian's python3-torch, Gloo backend), one process per replica (ddp_train.py).
# Every run is repeated (interleaved) and the median samples/s is printed with two speed-ups over
# DDP: lockstep's in-process replicas (its default), and lockstep over the same transport as DDP
# (Gloo's TCP). lockstep's numbers count every step, DDP's leave out 10 warm-up steps.
# Usage: bench/peers/compare_train.sh [REPEATS] [STEPS] [CONFIG...]
#   (default 3, 600, and the configs 8x32 2x128 1x256)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
repeats=${1:-3}
steps=${2:-600}
shift $(( $# < 2 ? $# : 2 ))
configs=()
for c in "${@:-8x32 2x128 1x256}"; do
  for one in $c; do configs+=("${one/x/ }"); done
done
out="$root/build/peers"
lockstep="$root/build/cli/lockstep"

"$root/scripts/setup.sh"
"$root/bench/peers/need_packages.sh" python3-torch jq
"$root/scripts/build.sh" >/dev/null
mkdir -p "$out"
results="$out/train_results.jsonl"
: > "$results"
mpi_root=(); [ "$(id -u)" -ne 0 ] || mpi_root=(--allow-run-as-root)

# One lockstep run: appends {peer, replicas, micro_batch, samples_per_s} from its --report.
lockstep_row() {  # peer replicas micro-batch command...
  local peer=$1 n=$2 b=$3; shift 3
  local report; report=$(mktemp "$out/report.XXXX.json")
  "$@" --micro-batch "$b" --steps "$steps" --quiet --report "$report" > /dev/null
  jq -c --arg p "$peer" '{peer: $p, replicas, micro_batch, samples_per_s}' "$report" >> "$results"
  rm -f "$report"
}

for ((r = 1; r <= repeats; r++)); do
  for c in "${configs[@]}"; do
    read -r n b <<< "$c"
    echo "repeat $r/$repeats: $n x $b" >&2
    lockstep_row lockstep-threads "$n" "$b" "$lockstep" train --replicas "$n"
    if [ "$n" -gt 1 ]; then
      lockstep_row lockstep-gloo "$n" "$b" "$lockstep" launch --nproc "$n" -- train
      lockstep_row lockstep-mpi "$n" "$b" mpirun "${mpi_root[@]}" --oversubscribe -np "$n" "$lockstep" train --backend mpi
    fi
    /usr/bin/python3 "$root/bench/peers/ddp_train.py" --nproc "$n" --micro-batch "$b" --steps "$steps" >> "$results"
    if [ "$n" -eq 1 ]; then  # one process: OpenBLAS on both cores, and on one; the faster is kept
      /usr/bin/python3 "$root/bench/peers/ddp_train.py" --nproc 1 --threads 1 --micro-batch "$b" --steps "$steps" >> "$results"
    fi
  done
done

median() {  # peer replicas micro-batch: the median samples/s over its runs (for DDP, of its best thread count)
  jq -s --arg p "$1" --argjson n "$2" --argjson b "$3" '
    [.[] | select(.peer == $p and .replicas == $n and .micro_batch == $b)] | group_by(.threads)
    | map([.[].samples_per_s] | sort | (.[(length - 1) / 2 | floor] + .[length / 2 | floor]) / 2) | max // null' "$results"
}
ratio() { jq -n --argjson a "$1" --argjson b "$2" 'if $a == null or $b == null then "-" else ($a / $b * 100 | round / 100 | tostring) + "x" end' -r; }
printf '%-8s %16s %14s %14s %14s %16s %16s\n' config lockstep_threads lockstep_gloo lockstep_mpi pytorch_ddp \
  threads_vs_ddp gloo_vs_ddp
for c in "${configs[@]}"; do
  read -r n b <<< "$c"
  ours=$(median lockstep-threads "$n" "$b"); gloo=$(median lockstep-gloo "$n" "$b")
  mpi=$(median lockstep-mpi "$n" "$b"); ddp=$(median pytorch-ddp "$n" "$b")
  fmt() { [ "$1" = null ] && echo - || printf '%.0f' "$1"; }
  printf '%-8s %16s %14s %14s %14s %16s %16s\n' "$n x $b" "$(fmt "$ours")" "$(fmt "$gloo")" "$(fmt "$mpi")" \
    "$(fmt "$ddp")" "$(ratio "$ours" "$ddp")" "$(ratio "$gloo" "$ddp")"
done
echo "samples/s, median of $repeats; raw results: $results"

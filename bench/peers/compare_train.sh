#!/usr/bin/env bash
# Training throughput beside PyTorch DDP, run by hand (never in CI). The same job on the same data
# (lockstep train's defaults: Fashion-MNIST, MLP 784-512-512-10, SGD with momentum, cosine) as
# 8 x 32, 2 x 128 and 1 x 256:
#   lockstep, in-process replicas (the default backend);
#   lockstep, one process per replica over Gloo/TCP on loopback (lockstep launch);
#   lockstep, one process per replica over OpenMPI (shared memory on one host);
#   PyTorch DDP (Debian's python3-torch, Gloo backend), one process per replica (ddp_train.py).
# Every run is repeated (interleaved) and the median samples/s is printed with lockstep's
# in-process speed-up over DDP. lockstep's numbers count every step, DDP's leave out 10 warm-up
# steps. Usage: bench/peers/compare_train.sh [REPEATS] [STEPS]   (default 3, 600)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
repeats=${1:-3}
steps=${2:-600}
out="$root/build/peers"
lockstep="$root/build/cli/lockstep"

"$root/scripts/setup.sh"
need=(python3-torch jq)
missing=()
for p in "${need[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
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

configs=("8 32" "2 128" "1 256")
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
    if [ "$n" -eq 1 ]; then  # torch 1.13 runs one process slower on two threads than on one: keep both
      /usr/bin/python3 "$root/bench/peers/ddp_train.py" --nproc 1 --threads 1 --micro-batch "$b" --steps "$steps" >> "$results"
    fi
  done
done

median() {  # peer replicas micro-batch: the median samples/s over its runs (for DDP, of its best thread count)
  jq -s --arg p "$1" --argjson n "$2" --argjson b "$3" '
    [.[] | select(.peer == $p and .replicas == $n and .micro_batch == $b)] | group_by(.threads)
    | map([.[].samples_per_s] | sort | .[(length - 1) / 2 | floor]) | max // null' "$results"
}
printf '%-8s %16s %14s %14s %14s %10s\n' config lockstep_threads lockstep_gloo lockstep_mpi pytorch_ddp speedup
for c in "${configs[@]}"; do
  read -r n b <<< "$c"
  ours=$(median lockstep-threads "$n" "$b"); gloo=$(median lockstep-gloo "$n" "$b")
  mpi=$(median lockstep-mpi "$n" "$b"); ddp=$(median pytorch-ddp "$n" "$b")
  fmt() { [ "$1" = null ] && echo - || printf '%.0f' "$1"; }
  speed=$(jq -n --argjson o "$ours" --argjson d "$ddp" '$o / $d * 10 | round / 10')
  printf '%-8s %16s %14s %14s %14s %9sx\n' "$n x $b" "$(fmt "$ours")" "$(fmt "$gloo")" "$(fmt "$mpi")" "$(fmt "$ddp")" "$speed"
done
echo "samples/s, median of $repeats; raw results: $results"

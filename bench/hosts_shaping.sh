#!/usr/bin/env bash
# How close scripts/hosts.sh's shaped links come to their rate: TCP goodput
# between test hosts (scripts/tcp_throughput.py, measured at the receiver),
# for one flow (h0 -> h1) and for two flows into one host (h0, h2 -> h1, which
# only the switch port's shaper limits). Run by hand as root, never in CI.
#
#   bench/hosts_shaping.sh [RATES...]      default: 100mbit 1gbit; 5 runs of 3 s each
#
# Prints, per rate and case, the median goodput in Mbit/s, its ratio to the
# rate, and its ratio to TCP's ceiling on that rate (1448 payload bytes per
# 1514-byte frame = 0.956: tbf counts Ethernet frames without preamble).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(100mbit 1gbit)
runs=${RUNS:-5}
seconds=${SECONDS_PER_RUN:-3}

"$root/scripts/hosts.sh" check
"$root/scripts/hosts.sh" cleanup

printf '%-8s %-12s %10s %9s %12s   %s\n' rate case Mbit/s of_rate of_ceiling "runs (Mbit/s)"
for rate in "${rates[@]}"; do
  bits=$(python3 -c "
import re,sys; m=re.fullmatch(r'([0-9.]+)([kmgt]?)bit', '$rate'.lower())
print(int(float(m.group(1))*{'':1,'k':1e3,'m':1e6,'g':1e9,'t':1e12}[m.group(2)]))")
  for case in "one flow" "two into one"; do
    hosts=2; [ "$case" = "one flow" ] || hosts=3
    samples=()
    for ((r = 0; r < runs; r++)); do
      samples+=("$("$root/scripts/hosts.sh" --hosts "$hosts" --rate "$rate" --timeout 120 -- bash -c "
        t='python3 $root/scripts/tcp_throughput.py'
        if [ \$HOST = 1 ]; then \$t serve --bind \$HOST_ADDR --connections $((hosts - 1));
        else \$t send --to 10.77.0.2 --seconds $seconds > /dev/null; fi" 2>/dev/null |
        sed -n 's/^\[h1\] //p' | python3 -c 'import json,sys; print(json.load(sys.stdin)["bits_per_second"])')")
    done
    python3 - "$rate" "$bits" "$case" "${samples[@]}" <<'EOF'
import statistics, sys
rate, bits, case, samples = sys.argv[1], int(sys.argv[2]), sys.argv[3], [int(s) for s in sys.argv[4:]]
med = statistics.median(samples)
print(f"{rate:<8} {case:<12} {med / 1e6:10.1f} {med / bits:9.3f} {med / (bits * 1448 / 1514):12.3f}   "
      + " ".join(f"{s / 1e6:.1f}" for s in samples))
EOF
  done
done

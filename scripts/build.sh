#!/usr/bin/env bash
# Configures and builds lockstep into build/ (or $LOCKSTEP_BUILD_DIR).
# Extra arguments go to CMake, e.g. -DLOCKSTEP_SANITIZE=thread;
# LOCKSTEP_TARGETS="a b" builds only those targets.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${LOCKSTEP_BUILD_DIR:-$root/build}"
"$root/scripts/setup.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
targets=()
for t in ${LOCKSTEP_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" --parallel "$(nproc)" "${targets[@]}"

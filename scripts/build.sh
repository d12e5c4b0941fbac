#!/usr/bin/env bash
# Configures and builds lockstep into build/ (or $LOCKSTEP_BUILD_DIR).
# Extra arguments go to CMake, e.g. -DLOCKSTEP_SANITIZE=thread.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${LOCKSTEP_BUILD_DIR:-$root/build}"
"$root/scripts/setup.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build" --parallel "$(nproc)"

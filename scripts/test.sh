#!/usr/bin/env bash
# Sets up, builds, and runs the whole test suite with CTest.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${LOCKSTEP_BUILD_DIR:-$root/build}"
"$root/scripts/build.sh"
ctest --test-dir "$build" --output-on-failure --parallel "$(nproc)" --timeout 900

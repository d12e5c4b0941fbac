#!/usr/bin/env bash
# Sets up, builds, and runs `lockstep train` (its defaults unless you pass flags).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/build.sh"
exec "${LOCKSTEP_BUILD_DIR:-$root/build}/cli/lockstep" train "$@"

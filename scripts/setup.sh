#!/usr/bin/env bash
# Installs what lockstep needs from Debian 12 packages, non-interactively.
# Idempotent: it installs only what is missing, and does nothing when all is there.
set -euo pipefail

packages=(
  g++ cmake ninja-build pkg-config
  libopenblas-dev zlib1g-dev libcli11-dev nlohmann-json3-dev
  libgtest-dev libbenchmark-dev
  libgloo-dev libhiredis-dev libssl-dev redis-server
  openmpi-bin libopenmpi-dev
  iproute2 python3
  dataset-fashion-mnist
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "setup: installing ${missing[*]}" >&2
# Through env: sudo's default policy resets the environment.
$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

#!/usr/bin/env bash
# Installs the Debian packages named as arguments that are not installed yet
# (non-interactive, idempotent), for the by-hand peer comparisons. A fresh
# image may have no package lists: it updates them once if the install
# cannot find a package. Usage: bench/peers/need_packages.sh PACKAGE...
set -euo pipefail
missing=()
for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p"); done
[ ${#missing[@]} -gt 0 ] || exit 0
sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
  { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }

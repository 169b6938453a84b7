#!/usr/bin/env bash
# Installs the Debian packages cf needs to build and test, only those missing.
# Idempotent: a second run does nothing. Runs apt-get as root, or through sudo.
set -euo pipefail

PACKAGES=(cmake g++ make ninja-build pkg-config nlohmann-json3-dev doctest-dev libopenblas-dev zlib1g-dev
  dataset-fashion-mnist fortunes)  # real data for the apps and the data tests (31 MB + 0.9 MB download)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present (${PACKAGES[*]})"
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "setup: missing packages: ${missing[*]}; no apt-get here, install them by hand" >&2
  exit 1
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
  else
    echo "setup: missing packages: ${missing[*]}; not root and no sudo, install them as root" >&2
    exit 1
  fi
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"

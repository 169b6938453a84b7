#!/usr/bin/env bash
# Installs the Debian packages cf needs to build and test, only those missing.
# Idempotent: a second run does nothing. Runs apt-get as root, or through sudo.
set -euo pipefail

PACKAGES=(cmake g++ make ninja-build pkg-config nlohmann-json3-dev doctest-dev libopenblas-dev zlib1g-dev
  dataset-fashion-mnist fortunes bible-kjv)  # real data for the apps and the data tests (31 + 0.9 + 1.6 MB download)
# Distributed training (dist/): Open MPI's headers and library, and mpirun for the
# 2-process tests. NCCL (CUDA tensors) comes with the CUDA toolkit where there is one.
PACKAGES+=(libopenmpi-dev openmpi-bin)
# The fuzz stage of scripts/test.sh: clang with libFuzzer (tests/fuzz).
PACKAGES+=(clang libfuzzer-14-dev)
# The Python package (python/): Debian's Python with venv and headers, NumPy, and
# PyTorch's CPU build for the interop tests (147 MB download; PyPI's torch wheel
# pulls gigabytes of CUDA libraries). CF_SETUP_TORCH=0 leaves PyTorch out: its
# tests then report themselves skipped.
PACKAGES+=(python3-venv python3-dev python3-numpy)
if [ "${CF_SETUP_TORCH:-1}" != "0" ]; then PACKAGES+=(python3-torch); fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# .venv: Debian's python3 with its packages (NumPy, PyTorch) visible, plus the
# build and test tools of python/requirements-dev.txt from PyPI. Re-run when
# that file changes.
setup_venv() {
  local venv="$root/.venv" req="$root/python/requirements-dev.txt"
  local py=/usr/bin/python3
  [ -x "$py" ] || py=python3
  if [ ! -x "$venv/bin/python" ]; then
    echo "setup: creating $venv ($py -m venv --system-site-packages)"
    "$py" -m venv --system-site-packages "$venv"
  fi
  if ! cmp -s "$req" "$venv/.cf-requirements"; then
    echo "setup: installing python/requirements-dev.txt into .venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
    cp "$req" "$venv/.cf-requirements"
  fi
}

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present (${PACKAGES[*]})"
  setup_venv
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
setup_venv

#!/usr/bin/env bash
# One command from a fresh clone: install what is missing, configure, build the
# demo and run it (it trains a small MLP and prints its falling loss as JSON lines).
# Extra arguments go to cf-demo, e.g. scripts/demo.sh --seed 3 --steps 2000
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${CF_BUILD_DIR:-$root/build}"
jobs="${CF_JOBS:-2}"

"$root/scripts/setup.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$jobs" --target cf-demo
"$build/apps/cf-demo" "$@"

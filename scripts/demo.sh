#!/usr/bin/env bash
# One command from a fresh clone: install what is missing (Debian packages,
# among them the fortunes corpus), configure, build the main demo and run it:
# cf-textcls trains the full-attention Transformer and ClusterFormer (neural
# clustering attention) on fortunes topic classification and prints their test
# accuracy, training time and peak memory side by side.
# It also builds the Python package into build/python and makes it importable
# by python3 and by .venv/bin/python (scripts/python-link.sh).
# Extra arguments go to cf-textcls, e.g. scripts/demo.sh --seeds 0,1,2 --attentions all
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${CF_BUILD_DIR:-$root/build}"
jobs="${CF_JOBS:-2}"

# --help answers at once: it installs and builds nothing.
for arg in "$@"; do
  if [ "$arg" = "--help" ] || [ "$arg" = "-h" ]; then
    echo "usage: scripts/demo.sh [cf-textcls options]"
    echo "Installs what is missing (scripts/setup.sh), builds cf-textcls, cf-demo and the Python package"
    echo "into ${build}, then runs cf-textcls with the options given."
    if [ -x "$build/apps/cf-textcls" ]; then
      echo
      "$build/apps/cf-textcls" --help
    else
      echo "cf-textcls is not built yet: its options are listed by $build/apps/cf-textcls --help"
      echo "once scripts/demo.sh (or the README's build) has built it."
    fi
    exit 0
  fi
done

"$root/scripts/setup.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCF_PYTHON=ON -DPython_EXECUTABLE="$root/.venv/bin/python"
cmake --build "$build" -j "$jobs" --target cf-textcls cf-demo cf_python
"$root/scripts/python-link.sh" "$build/python"
source "$root/scripts/openblas-env.sh"  # OpenBLAS kernels for CPUs its version does not know
"$build/apps/cf-textcls" "$@"

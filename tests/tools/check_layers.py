#!/usr/bin/env python3
"""The include graph follows the layers (docs/design-notes.md, "Layers").

core -> kernels -> autograd -> dist -> nn -> models -> apps / python: a file may
include its own layer and the layers below it, never one above. Inside nn,
layers/ (Linear, LayerNorm, ...) -> attention/ (the variants, built from
layers) -> blocks/ (transformer layers, built from both).

nn reaches kernels only through autograd ops (which validate arguments and
record graph nodes): no file of nn includes a kernels/ header.

Usage: check_layers.py SOURCE_ROOT   (exit 0 clean, 1 with the violations listed)
"""
import os
import re
import sys

LAYERS = ["core", "kernels", "autograd", "dist", "nn", "models", "apps"]
RANK = {name: i for i, name in enumerate(LAYERS)}
RANK["python"] = RANK["apps"]
NN_SUB = {"layers": 0, "attention": 1, "blocks": 2}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(path):
    parts = path.split("/")
    if parts[0] == "python":
        return "python", None
    sub = parts[1] if parts[0] == "nn" and len(parts) > 2 else None
    return parts[0], sub


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    errors = []
    for top in list(RANK):
        base = os.path.join(root, top)
        for dirpath, _, files in os.walk(base):
            for f in files:
                if not f.endswith((".h", ".cpp", ".cu", ".cuh")):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/")
                src_layer, src_sub = layer_of(rel)
                with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
                    for lineno, line in enumerate(fh, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        inc = m.group(1)
                        dst_layer, dst_sub = layer_of(inc)
                        if dst_layer not in RANK or inc.count("/") == 0:
                            continue  # a sibling file ("x.h") or a third-party header
                        where = f"{rel}:{lineno}: includes {inc}"
                        if RANK[dst_layer] > RANK[src_layer]:
                            errors.append(f"{where} ({dst_layer} is above {src_layer})")
                        elif src_layer == "nn" and dst_layer == "nn" and src_sub in NN_SUB and dst_sub in NN_SUB \
                                and NN_SUB[dst_sub] > NN_SUB[src_sub]:
                            errors.append(f"{where} (nn/{dst_sub} is above nn/{src_sub})")
                        elif src_layer == "nn" and dst_layer == "kernels":
                            errors.append(f"{where} (nn reaches kernels only through autograd ops)")
    for e in errors:
        print(e)
    print(f"check_layers: {len(errors)} problem(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

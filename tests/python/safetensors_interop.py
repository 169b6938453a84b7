#!/usr/bin/env python3
"""cf <-> Python safetensors interop (CTest: safetensors_python_interop).

1. cf writes a file (tests/tools/safetensors_tool.cpp, `write`); safetensors.numpy
   reads it and the values must match the reference below bit for bit.
2. safetensors.numpy writes the reference tensors with metadata; cf reads them
   (`check`) and compares bytes.

Exits 77 (CTest SKIP_RETURN_CODE) when numpy or safetensors is not importable.
Usage: safetensors_interop.py --tool <cf_safetensors_tool> --dir <scratch dir>
"""
import argparse
import os
import subprocess
import sys

SKIP = 77


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--dir", required=True)
    args = ap.parse_args()

    missing = []
    try:
        import numpy as np
    except ImportError:
        missing.append("numpy (Debian: python3-numpy, or pip install numpy)")
    try:
        from safetensors.numpy import load_file, save_file
    except ImportError:
        missing.append("safetensors (pip install safetensors; Debian bookworm has no package)")
    if missing:
        print("SKIPPED: %s cannot import %s" % (sys.executable, " and ".join(missing)))
        return SKIP

    note = "caf\u00e9 \u2713"
    a = ((np.arange(6, dtype=np.float64) - 2.5) * 0.375).astype(np.float32).reshape(2, 3)
    ref = {
        "a_f32": a,
        "b_f64": (np.arange(6, dtype=np.float64) * 0.1 - 0.7).reshape(3, 2),
        "c_i64": np.array([0, -1, 1 << 62, -(1 << 63)], dtype=np.int64),
        "d_bool": np.array([[True, False], [False, True]]),
        "e_scalar": np.array(3.141592653589793, dtype=np.float64),
        "f_empty": np.zeros((0, 3), dtype=np.float32),
        "g_special": np.array([np.inf, -np.inf, np.nan, -0.0, np.finfo(np.float32).smallest_subnormal,
                               np.finfo(np.float32).max], dtype=np.float32),
    }

    os.makedirs(args.dir, exist_ok=True)
    failures = []

    def same(name, got, want):
        if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
            failures.append("%s: got %s %s %r, expected %s %s %r" % (
                name, got.dtype, got.shape, got, want.dtype, want.shape, want))
        else:
            print("ok %s %s %s" % (name, got.dtype, got.shape))

    # 1. cf writes, Python reads.
    cf_file = os.path.join(args.dir, "from_cf.safetensors")
    subprocess.run([args.tool, "write", cf_file], check=True)
    got = load_file(cf_file)
    want = dict(ref)
    want["h_transposed"] = np.ascontiguousarray(a.T)
    if sorted(got) != sorted(want):
        failures.append("names: got %s, expected %s" % (sorted(got), sorted(want)))
    for name in want:
        if name in got:
            same(name, got[name], want[name])
    from safetensors import safe_open
    with safe_open(cf_file, framework="np") as f:
        meta = f.metadata()
    if meta != {"creator": "cf", "note": note}:
        failures.append("metadata from cf: %r" % (meta,))

    # 2. Python writes, cf reads.
    py_file = os.path.join(args.dir, "from_python.safetensors")
    save_file(ref, py_file, metadata={"creator": "python", "note": note})
    r = subprocess.run([args.tool, "check", py_file, "python"], capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    if r.returncode != 0:
        failures.append("cf could not read the file Python wrote (exit %d)" % r.returncode)

    for p in (cf_file, py_file):
        if os.path.exists(p):
            os.remove(p)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("safetensors interop: cf -> Python and Python -> cf match exactly")
    return 0


if __name__ == "__main__":
    sys.exit(main())

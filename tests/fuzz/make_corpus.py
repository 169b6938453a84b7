#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/):
small valid files of each format plus a few near misses, so the fuzzer starts
from inputs that pass the magic and header checks. Standard library only.
Run from anywhere; it rewrites the corpus folders."""
import gzip
import json
import os
import struct

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(here, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, raw bytes)."""
    header, buf = {}, b""
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(buf), len(buf) + len(raw)]}
        buf += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + buf


f32 = lambda *v: struct.pack("<%df" % len(v), *v)
f64 = lambda *v: struct.pack("<%dd" % len(v), *v)
i64 = lambda *v: struct.pack("<%dq" % len(v), *v)

# ---- safetensors ----
put("safetensors", "all_dtypes", safetensors([
    ("a", "F32", [2, 3], f32(1, 2, 3, 4, 5, 6)), ("b", "F64", [2], f64(0.5, -1)),
    ("c", "I64", [1, 1], i64(7)), ("d", "BOOL", [3], b"\x01\x00\x01"), ("e", "F32", [0, 4], b"")],
    {"creator": "cf"}))
put("safetensors", "scalar", safetensors([("s", "F64", [], f64(3.25))]))
put("safetensors", "empty", safetensors([]))
put("safetensors", "truncated", safetensors([("a", "F32", [4], f32(1, 2, 3, 4))])[:-5])

# ---- checkpoint (cf metadata) ----
meta = {"cf.format": "cf.checkpoint", "cf.format_version": "1", "step": "12", "rng.count": "2",
        "rng.0.name": "default", "rng.0.seed": "7", "rng.0.offset": "40",
        "rng.1.name": "data", "rng.1.seed": "18446744073709551615", "rng.1.offset": "0",
        "extra.signature": "{}", "extra.train_time_s": "1.5"}
put("checkpoint", "full", safetensors([
    ("model.fc.weight", "F32", [2, 2], f32(1, 2, 3, 4)), ("model.fc.bias", "F32", [2], f32(0, 0)),
    ("optim.state.0.exp_avg", "F64", [2], f64(0.1, 0.2)), ("optim.state.0.step", "I64", [], i64(3))], meta))
put("checkpoint", "no_rng", safetensors([("model.w", "F32", [1], f32(1))],
                                         {"cf.format": "cf.checkpoint", "cf.format_version": "1",
                                          "step": "0", "rng.count": "0"}))

# ---- .npy ----
def npy(descr, shape, raw, fortran=False, version=1):
    d = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (
        descr, "True" if fortran else "False", "(%s)" % "".join("%d, " % s for s in shape) if len(shape) != 1
        else "(%d,)" % shape[0])
    pre = 10 if version == 1 else 12
    d += " " * (-(pre + len(d) + 1) % 64) + "\n"
    if version == 1:
        head = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d))
    else:
        head = b"\x93NUMPY\x02\x00" + struct.pack("<I", len(d))
    return head + d.encode("latin1") + raw


put("npy", "f4_2x3", npy("<f4", [2, 3], f32(1, 2, 3, 4, 5, 6)))
put("npy", "f8_vec", npy("<f8", [2], f64(1.5, -2)))
put("npy", "i8_fortran", npy("<i8", [2, 2], i64(1, 2, 3, 4), fortran=True))
put("npy", "i4", npy("<i4", [3], struct.pack("<3i", 1, -2, 3)))
put("npy", "u1", npy("|u1", [4], b"\x00\x01\xfe\xff"))
put("npy", "b1", npy("|b1", [2], b"\x01\x00"))
put("npy", "scalar", npy("<f8", [], f64(4)))
put("npy", "empty_rows", npy("<f4", [0, 4], b""))
put("npy", "v2", npy("<f4", [1], f32(9), version=2))

# ---- IDX (plain) and gzip ----
def idx(type_code, shape, raw):
    return b"\x00\x00" + bytes([type_code, len(shape)]) + b"".join(struct.pack(">I", s) for s in shape) + raw


images = idx(0x08, [2, 2, 3], bytes(range(12)))
labels = idx(0x08, [3], b"\x01\x02\x09")
put("idx", "ubyte_images", images)
put("idx", "ubyte_labels", labels)
put("idx", "sbyte", idx(0x09, [2], b"\x80\x7f"))
put("idx", "short", idx(0x0B, [2], struct.pack(">2h", -3, 4)))
put("idx", "int", idx(0x0C, [1, 2], struct.pack(">2i", -5, 6)))
put("idx", "float", idx(0x0D, [2], struct.pack(">2f", 1.5, -2)))
put("idx", "double", idx(0x0E, [1], struct.pack(">d", 0.25)))
put("idx", "zero_rows", idx(0x08, [0, 4], b""))
put("gzip", "images.gz", gzip.compress(images, mtime=0))
put("gzip", "labels.gz", gzip.compress(labels, mtime=0))
put("gzip", "double.gz", gzip.compress(idx(0x0E, [2], struct.pack(">2d", 1, 2)), mtime=0))
put("gzip", "truncated.gz", gzip.compress(images, mtime=0)[:-6])

# ---- text_tables (labelled texts and MNIST CSV) ----
put("text_tables", "labelled", "law\tIn the beginning\nwisdom\tline one\\nline two \\\\ x\r\n\nb\tz")
put("text_tables", "bad_line", "a\tb\nno tab\n")
put("text_tables", "mnist_row", ",".join(str((7 * i) % 256) for i in range(784)) + ",3\n")
put("text_tables", "mnist_short", "1,2,3\n")

# ---- fortunes ----
put("fortunes", "three", "A first fortune.\n%\nA second one,\n  over two lines.\n%\n%\nThird\r\n%\n")
put("fortunes", "no_percent", "just one text without separators\n")
put("fortunes", "utf8", "caf\u00e9 \u2713\n%\n\u00fc\u00f1\u00ee\u00e7\u00f8d\u00eb\n")

# ---- JSON configs ----
put("json_config", "app", json.dumps({"k": 8, "steps": 100, "lr": 0.001, "type": "full", "causal": True,
                                      "shape": [2, 3], "attentions": ["full", "lsh"], "seeds": [1, 2],
                                      "betas": [0.9, 0.999], "scale": 1.5, "seed": 3}))
put("json_config", "nested", '// comment\n{"model": {"d_model": 64, "attention": {"type": "lsh"}}, "k": 1e6}\n')
put("json_config", "bad_types", '{"k": "eight", "lr": null, "causal": 1, "shape": [1, -2], "k2": 1e400}')
put("json_config", "not_object", "[1, 2, 3]")

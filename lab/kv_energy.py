#!/usr/bin/env python3
"""Per layer and tensor: how much of the KV energy is one shared vector, and what a codec's error
is relative to the part that varies (docs/lab/kv_energy.md, "why layer 0 of Qwen2.5 is special").

    python3 lab/kv_energy.py SESSION.tqkv [--codec tq3 --codec tq4] [--block 128] \\
        [--tqkv build/tqkv] [--json out.json]

SESSION is a lossless (fp16) session, e.g. one `tqkv llama import --codec fp16` or `tqkv
checkpoint --codec fp16` wrote. It is decompressed to f32 with `tqkv decompress`; each codec is
applied with `tqkv compress` twice (keys mean-removed, the default, and `--key-means off`) and
decompressed again. Per layer and tensor (K, V), over every KV head and block of --block tokens:
- shared: the block mean's share of the energy, n·‖μ‖² / Σ‖x‖² (1 = every vector the same);
- err/var: the codec's squared error over the energy of the varying part, Σ‖x̂ − x‖² / Σ‖x − μ‖²
  (what attention sees: a constant added to every key cancels in softmax), for the plain codec
  and with mean-removed keys (V is never centered, so only its plain figure is given).
Prints a Markdown table; --json writes the figures. Needs numpy.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            raise SystemExit(f"{path}: {name} is {t['dtype']}, expected F32")
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=np.float32).reshape(t["shape"])
    return out


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr}")


def block_means(x, block):
    """x: [tokens, heads, dim] -> per-token mean of its block, same shape."""
    t = x.shape[0]
    out = np.empty_like(x)
    for lo in range(0, t, block):
        out[lo:lo + block] = x[lo:lo + block].mean(axis=0, keepdims=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("session")
    ap.add_argument("--codec", action="append", default=None)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--tqkv", default=os.environ.get("TQKV_CLI", "build/tqkv"))
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    codecs = a.codec or ["tq3", "tq4"]
    tmp = tempfile.mkdtemp(prefix="kv_energy_")
    ref_st = os.path.join(tmp, "ref.safetensors")
    run([a.tqkv, "decompress", a.session, ref_st, "--dtype", "f32"])
    ref = read_safetensors(ref_st)
    layers = sorted({int(n.split(".")[1]) for n in ref})
    decoded = {}
    for c in codecs:
        for km in ("default", "off"):
            tq, st = os.path.join(tmp, f"{c}-{km}.tqkv"), os.path.join(tmp, f"{c}-{km}.safetensors")
            extra = ["--key-means", "off"] if km == "off" else []
            run([a.tqkv, "compress", ref_st, tq, "--codec", c, *extra])
            run([a.tqkv, "decompress", tq, st, "--dtype", "f32"])
            decoded[(c, km)] = read_safetensors(st)
            os.remove(tq)
            os.remove(st)
        print(f"{c} done", file=sys.stderr, flush=True)
    rows = []
    for l in layers:
        for kv in ("k", "v"):
            name = f"layers.{l}.{kv}"
            x = ref[name].astype(np.float64)
            mu = block_means(x, a.block)
            total = float((x * x).sum())
            var = float(((x - mu) ** 2).sum())
            row = {"layer": l, "tensor": kv.upper(),
                   "shared": 1.0 - var / total if total > 0 else 0.0,
                   "max_abs": float(np.abs(x).max())}
            for c in codecs:
                for km in ("off", "default"):
                    if kv == "v" and km == "default":
                        continue  # values are never centered: the same bytes as plain
                    err = float(((decoded[(c, km)][name].astype(np.float64) - x) ** 2).sum())
                    row[f"{c}{'' if km == 'off' else '+km'}"] = err / var if var > 0 else 0.0
            rows.append(row)
    cols = [k for k in rows[0] if k not in ("layer", "tensor", "shared", "max_abs")]
    print(f"| layer | tensor | shared (block {a.block}) | max \\|x\\| | "
          + " | ".join(f"{c} err/var" for c in cols) + " |")
    print("|---|---|---:|---:|" + "---:|" * len(cols))
    for r in rows:
        cells = [f"{r[c]:.3f}" if c in r else "–" for c in cols]  # V: never centered
        print(f"| {r['layer']} | {r['tensor']} | {r['shared']:.4f} | {r['max_abs']:.1f} | "
              + " | ".join(cells) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"session": a.session, "block": a.block, "codecs": codecs, "rows": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The Python package against the tqkv command, in one run on one machine (docs/benchmarks.md).

1. Restore: a qwen2.5-7b session (default 10,000 tokens, tq3) checkpointed by `tqkv checkpoint`,
   restored alternately by `tqkv restore --json` and by tqkv.restore(..., out=) into arrays
   allocated and touched beforehand (as the CLI does), page cache warm. Reported: the library's
   restore time (first read to last layer decoded) and, for Python, also the wall time of the
   call; best and median of --reps each.
2. Codec: tqkv.Codec encode/decode GB/s (fp16-equivalent bytes, as `tqkv-bench codec` counts)
   on a float16 array of --codec-gib GiB, against `tqkv-bench codec` on as many vectors.
3. Layouts (--bench layouts): the same session restored by tqkv.restore(out=) into the canonical
   layout, the transposed one (layout="hnd") and vLLM-style paged blocks (16 tokens, shuffled
   block ids), each decoded in place, and the canonical restore followed by a numpy copy into the
   transposed layout (what staging costs); rounds alternate the four, best and median of --reps.

Prints JSON. Usage: PYTHONPATH=build/python python3 bench/python_bench.py --cli build/tqkv
(`tqkv-bench` is taken from beside --cli unless --bench-cli names it)
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

import numpy as np

import tqkv


def restore_bench(cli, tokens, codec, reps, workdir):
    store_dir = os.path.join(workdir, "kv")
    subprocess.run([cli, "checkpoint", "--model", "qwen2.5-7b", "--tokens", str(tokens),
                    "--codec", codec, "--store", store_dir, "--session", "s"], check=True,
                   capture_output=True)
    store = tqkv.open_store(store_dir)
    h = store.header("s")
    shape = (h["layers"], h["tokens"], h["kv_heads"], h["head_dim"])
    k, v = np.zeros(shape, np.float16), np.zeros(shape, np.float16)  # touched, as the CLI's
    cli_s, py_s, py_wall = [], [], []
    for _ in range(reps):
        out = subprocess.run([cli, "restore", "--store", store_dir, "--session", "s", "--json"],
                             check=True, capture_output=True, text=True).stdout
        cli_s.append(json.loads(out)["restore_s"])
        stats = {}
        t = time.perf_counter()
        tqkv.restore(store, "s", out=(k, v), stats=stats)
        py_wall.append(time.perf_counter() - t)
        py_s.append(stats["seconds"])

    def summary(xs):
        return {"best_s": min(xs), "median_s": statistics.median(xs), "all_s": xs}

    return {
        "tokens": tokens, "codec": codec, "bytes": store.size("s"), "reps": reps,
        "cli_restore": summary(cli_s), "python_restore": summary(py_s),
        "python_call_wall": summary(py_wall),
        "python_vs_cli_best": min(py_s) / min(cli_s),
        "python_wall_vs_cli_best": min(py_wall) / min(cli_s),
        "python_vs_cli_median": statistics.median(py_s) / statistics.median(cli_s),
    }


def layouts_bench(cli, tokens, codec, reps, workdir):
    store_dir = os.path.join(workdir, "kv-layouts")
    subprocess.run([cli, "checkpoint", "--model", "qwen2.5-7b", "--tokens", str(tokens),
                    "--codec", codec, "--store", store_dir, "--session", "s"], check=True,
                   capture_output=True)
    store = tqkv.open_store(store_dir)
    h = store.header("s")
    layers, heads, d = h["layers"], h["kv_heads"], h["head_dim"]
    bs = 16
    nblocks = -(-tokens // bs)
    ids = np.random.default_rng(2).permutation(nblocks)
    dests = {  # zeros: touched beforehand, as the CLI's
        "nhd": dict(out=tuple(np.zeros((layers, tokens, heads, d), np.float16) for _ in "kv")),
        "hnd": dict(out=tuple(np.zeros((layers, heads, tokens, d), np.float16) for _ in "kv"),
                    layout="hnd"),
        "paged": dict(out=tuple(np.zeros((layers, nblocks, bs, heads, d), np.float16)
                                for _ in "kv"), layout="paged", block_ids=ids, tokens=tokens),
    }
    copy_to = tuple(np.zeros((layers, heads, tokens, d), np.float16) for _ in "kv")
    times = {name: [] for name in ("nhd", "hnd", "paged", "nhd_then_copy_to_hnd")}
    staged = {}
    for _ in range(reps):
        for name, kwargs in dests.items():
            stats = {}
            t = time.perf_counter()
            tqkv.restore(store, "s", stats=stats, **kwargs)
            times[name].append(time.perf_counter() - t)
            staged[name] = stats["staged"]
        t = time.perf_counter()
        k, v = tqkv.restore(store, "s", **dests["nhd"])
        np.copyto(copy_to[0], k.transpose(0, 2, 1, 3))
        np.copyto(copy_to[1], v.transpose(0, 2, 1, 3))
        times["nhd_then_copy_to_hnd"].append(time.perf_counter() - t)
    base = statistics.median(times["nhd"])
    return {
        "tokens": tokens, "codec": codec, "reps": reps, "block_size": bs, "staged": staged,
        "wall_s": {n: {"best": min(x), "median": statistics.median(x), "all": x}
                   for n, x in times.items()},
        "median_vs_nhd": {n: statistics.median(x) / base for n, x in times.items()},
    }


def codec_bench(bench_cli, gib, codec, reps, threads):
    d = 128
    n = int(gib * (1 << 30)) // (2 * d)
    rng = np.random.default_rng(1)
    x = np.empty((n, d), np.float16)
    for i in range(0, n, 1 << 18):  # in pieces: no float32 copy of the whole array
        x[i:i + (1 << 18)] = rng.standard_normal((min(1 << 18, n - i), d), dtype=np.float32)
    c = tqkv.Codec(codec, head_dim=d)
    codes = np.empty((n, c.code_bytes), np.uint8)
    y = np.empty_like(x)
    c.encode(x, out=codes)  # first touch of codes outside the timing
    c.decode(codes, out=y)
    enc, dec = [], []
    for _ in range(reps):
        t = time.perf_counter()
        c.encode(x, out=codes)
        enc.append(time.perf_counter() - t)
        t = time.perf_counter()
        c.decode(codes, out=y)
        dec.append(time.perf_counter() - t)
    fp16_bytes = 2.0 * d * n
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([bench_cli, "codec", "--codec", codec, "--vectors", str(n), "--dim",
                        str(d), "--threads", str(threads), "--reps", str(reps), "--json", f.name],
                       check=True, capture_output=True)
        cli_row = json.load(open(f.name))["results"][0]
    py_enc, py_dec = fp16_bytes / min(enc) / 1e9, fp16_bytes / min(dec) / 1e9
    return {
        "codec": codec, "vectors": n, "dim": d, "array_bytes": int(fp16_bytes),
        "threads": threads, "reps": reps,
        "python_encode_gbps": py_enc, "python_decode_gbps": py_dec,
        "cli_encode_gbps": cli_row["encode_gbps"], "cli_decode_gbps": cli_row["decode_gbps"],
        "encode_ratio": py_enc / cli_row["encode_gbps"],
        "decode_ratio": py_dec / cli_row["decode_gbps"],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cli", default="build/tqkv")
    ap.add_argument("--bench-cli", default=None, help="tqkv-bench (default: beside --cli)")
    ap.add_argument("--tokens", type=int, default=10000)
    ap.add_argument("--codec", default="tq3")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--codec-gib", type=float, default=1.0)
    ap.add_argument("--workdir", default=None, help="default: a temporary directory")
    ap.add_argument("--bench", default="restore,codec", help="restore, codec, layouts")
    args = ap.parse_args()
    which = args.bench.split(",")
    threads = tqkv.get_num_threads()
    result = {"machine_load_1min": os.getloadavg()[0], "threads": threads}
    bench_cli = args.bench_cli or os.path.join(os.path.dirname(args.cli), "tqkv-bench")
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        if "restore" in which:
            result["restore"] = restore_bench(args.cli, args.tokens, args.codec, args.reps, work)
        if "codec" in which:
            result["codec"] = codec_bench(bench_cli, args.codec_gib, args.codec,
                                          max(3, args.reps // 2), threads)
        if "layouts" in which:
            result["layouts"] = layouts_bench(args.cli, args.tokens, args.codec, args.reps, work)
    result["machine_load_1min_after"] = os.getloadavg()[0]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

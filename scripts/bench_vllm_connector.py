#!/usr/bin/env python3
"""The vLLM connector's restore and save paths against `tqkv restore` / `tqkv checkpoint` of the
same tokens, geometry and codec, without a vLLM server: the connector's own worker code
(tqkv.vllm.worker.Loader, tqkv.vllm.writer.ChunkWriter) on a vLLM CPU cache tensor of the model's
geometry, timed by the connector's own counters (restore_seconds, save_seconds).

    PY=$(scripts/setup-vllm.sh); PYTHONPATH=build/python $PY scripts/bench_vllm_connector.py \
        --tokens 1024,4096,16384 --codec tq3 --codec fp16 [--cold] [--rounds 3] > out.json

Geometry: Qwen2.5-Coder-1.5B (28 layers, 2 KV heads, head_dim 128, bfloat16), vLLM's CPU
layout of attention ISA --isa (vec: the layout on CPUs without AMX) and block --block; chunks of
the connector's default size. Per tokens and codec: the chunks' bytes against one session of the
same tokens (`tqkv.checkpoint` of the restored chunks, exact tokens off as in the chunks); restore
seconds of the connector (one tqkv.restore_batch into the cache) and of `tqkv restore --dtype bf16`
(its --json seconds) of that session, alternating, page cache or (--cold, root) after dropping
the page cache; save seconds of the writer and of `tqkv.checkpoint` of the same tokens from
memory. Progress on stderr, one JSON object on stdout. Name the CPU with the figures.
"""
import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import tqkv
from tqkv.vllm import Stats, default_chunk_tokens
from tqkv.vllm.worker import Loader, paged_kv
from tqkv.vllm.writer import ChunkOp, ChunkWriter

ROOT = Path(__file__).resolve().parent.parent
LAYERS, HEADS, DIM = 28, 2, 128
log = logging.getLogger("bench")


def note(msg):
    print(f"bench_vllm_connector {time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.1f}: "
          f"{msg}", file=sys.stderr, flush=True)


def drop():
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def cli_restore(cli, store, key, cold):
    if cold:
        drop()
    r = subprocess.run([cli, "restore", "--store", str(store), "--session", key, "--dtype",
                        "bf16", "--json"], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["restore_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1024,4096,16384")
    ap.add_argument("--codec", action="append")
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--isa", default="vec")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--dir", default="")
    ap.add_argument("--cli", default=str(ROOT / "build" / "tqkv"))
    a = ap.parse_args()
    codecs = a.codec or ["tq3", "fp16"]
    chunk = default_chunk_tokens(a.block)
    work = Path(a.dir or tempfile.mkdtemp(prefix="bench-vllm-conn-"))
    geo = {"layers": LAYERS, "kv_heads": HEADS, "head_dim": DIM}
    out = {"cpu": open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(" :\t"),
           "threads": tqkv.get_num_threads(), "block": a.block, "isa": a.isa, "chunk": chunk,
           "cold": a.cold, "rows": []}
    gen = torch.Generator().manual_seed(0)
    for tokens in [int(t) for t in a.tokens.split(",")]:
        if tokens % a.block:
            sys.exit(f"--tokens {tokens}: not a whole number of {a.block}-token blocks")
        blocks = tokens // a.block
        # the prompt's objects: full chunks, then its tail (fewer tokens than a chunk)
        objs = [(f"c{i}", i * chunk, chunk) for i in range(tokens // chunk)]
        if tokens % chunk:
            objs.append(("tail", len(objs) * chunk, tokens % chunk))
        n = len(objs)

        def ops_of(first_tokens: bool):
            return [ChunkOp(key, "m", list(range(at // a.block, (at + size) // a.block)), "r",
                            at if first_tokens else 0, 0 if size == chunk else size)
                    for key, at, size in objs]
        cache = {f"model.layers.{i}.attn": torch.randn(blocks, HEADS, a.block, 2 * DIM,
                                                        generator=gen).to(torch.bfloat16)
                 for i in range(LAYERS)}
        kv, _, _ = paged_kv(cache, geo, a.block, chunk, a.isa)
        for codec in codecs:
            row = {"tokens": tokens, "codec": codec, "chunks": n, "restore_connector_s": [],
                   "restore_cli_s": [], "save_writer_s": [], "save_library_s": []}
            fp16 = tokens * LAYERS * 2 * HEADS * DIM * 2
            for rnd in range(a.rounds):
                store_dir = work / f"s-{tokens}-{codec}"
                shutil.rmtree(store_dir, ignore_errors=True)
                store = tqkv.open_store(str(store_dir))
                st = Stats()
                ChunkWriter(store, {"codec": codec}, st, threaded=False,
                            log=log).submit(ops_of(True), kv)
                row["save_writer_s"].append(st.snapshot()["save_seconds"])
                row["chunk_bytes"] = sum(store.size(key) for key, _, _ in objs)
                ks, vs = zip(*(tqkv.restore(store, key, dtype="bfloat16", array="torch")
                               for key, _, _ in objs))
                k, v = torch.cat(ks, 1).contiguous(), torch.cat(vs, 1).contiguous()
                whole = tqkv.checkpoint(store, "whole", k, v, codec=codec, exact_tokens=(0, 0),
                                        model="m")
                row["save_library_s"].append(whole["seconds"])
                row["session_bytes"] = store.size("whole")
                del ks, vs, k, v
                for order in ((0, 1) if rnd % 2 == 0 else (1, 0)):
                    if order == 0:
                        if a.cold:
                            drop()
                        dst = {name: torch.zeros_like(x) for name, x in cache.items()}
                        kv2, _, _ = paged_kv(dst, geo, a.block, chunk, a.isa)
                        loads = ops_of(False)
                        st = Stats()
                        ld = Loader(store, st, log)
                        ld.start(loads, kv2)
                        ld.join()
                        assert not ld.take_failed()
                        row["restore_connector_s"].append(st.snapshot()["restore_seconds"])
                        del dst, kv2
                    else:
                        row["restore_cli_s"].append(cli_restore(a.cli, store_dir, "whole", a.cold))
            best = {k: min(row[k]) for k in ("restore_connector_s", "restore_cli_s",
                                            "save_writer_s", "save_library_s")}
            row["restore_ratio"] = best["restore_cli_s"] / best["restore_connector_s"]
            row["save_ratio"] = best["save_library_s"] / best["save_writer_s"]
            row["bytes_ratio"] = row["chunk_bytes"] / row["session_bytes"]
            row["fp16_bytes"] = fp16
            note(f"{tokens} {codec}: restore connector {best['restore_connector_s']:.4f} s vs "
                 f"cli {best['restore_cli_s']:.4f} s ({row['restore_ratio']:.2f}x), save writer "
                 f"{best['save_writer_s']:.3f} s vs library {best['save_library_s']:.3f} s "
                 f"({row['save_ratio']:.2f}x), bytes {row['bytes_ratio']:.4f}x one session")
            out["rows"].append(row)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    sys.exit(main())

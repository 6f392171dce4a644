#!/usr/bin/env python3
"""vLLM's own `fs` tier and the tqkv tier driven through the same SecondaryTierManager calls, with
the same CPU primary rows holding a real model's KV; side by side: bytes stored, store and load
GB/s, round-trip exactness (fp16) or error (tq3), a corrupted object and another model's object.

    PY=$(scripts/setup-vllm.sh); PYTHONPATH=build/python $PY scripts/bench_vllm_tier.py \\
        --kv-store DIR [--tokens 4096] [--block 16] [--blocks-per-chunk 1] [--layout NHD] \\
        [--codecs fp16,tq3] [--rounds 3] [--job-chunks 16] [--json OUT]

--kv-store: a tqkv store of fp16 sessions holding real KV, e.g. what TqkvConnector saved from
vLLM with codec fp16 (tests/vllm) or `tqkv.llama` from llama.cpp; its sessions are concatenated
(repeated if short) to --tokens tokens. The rows are laid out as vLLM 0.32's CPU offload tier
holds them for a GPU cache of --layout (offload_layout.py, written here independently of it),
--blocks-per-chunk GPU blocks of --block tokens per chunk (vLLM's offload `block_size` / GPU
block size). Stores are submitted as vLLM's cascade does, jobs of --job-chunks chunks; times run
from the first submit to the last finished job (fp16 KV bytes / s). Loads read what the round
stored (from the page cache unless the tier reads with O_DIRECT: vLLM's fs tier does). Progress
to stderr, one JSON object to stdout (and --json). Name the CPU with the figures.
"""
from __future__ import annotations

import argparse
import json
import mmap
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def log(msg: str) -> None:
    print(f"bench_vllm_tier {time.strftime('%H:%M:%S')}: {msg}", file=sys.stderr, flush=True)


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def real_kv(store_uri: str, tokens: int):
    """K and V [layers, tokens, heads, dim] float16 from the store's sessions, in key order."""
    import tqkv
    st = tqkv.open_store(store_uri, create=False)
    ks, vs, have = [], [], 0
    keys = sorted(s["key"] for s in st.ls())
    if not keys:
        raise SystemExit(f"bench_vllm_tier: no sessions in {store_uri}")
    while have < tokens:
        for key in keys:
            k, v = tqkv.restore(st, key, dtype="float16")
            ks.append(k), vs.append(v)
            have += k.shape[1]
            if have >= tokens:
                break
    k, v = np.concatenate(ks, axis=1)[:, :tokens], np.concatenate(vs, axis=1)[:, :tokens]
    return np.ascontiguousarray(k), np.ascontiguousarray(v)


def to_rows(k: np.ndarray, v: np.ndarray, layout: str, block: int, per_chunk: int) -> np.ndarray:
    """The primary rows vLLM's offload keeps for these tokens: per chunk, per layout, the pages
    [layer][block][page] (layer-outer) or [block][layer][page], a page [N][H][2D] (..NHC) or
    [H][N][2D] (..HNC), K in channels [0, D), V in [D, 2D). Reference for offload_layout."""
    L, T, H, D = k.shape
    chunk = block * per_chunk
    c = T // chunk
    kv = np.concatenate([k, v], axis=-1)[:, :c * chunk]           # [L, T, H, 2D]
    kv = kv.reshape(L, c, per_chunk, block, H, 2 * D)              # L, chunk, blk, N, H, C
    if layout in ("LBHNC", "BLHNC"):
        kv = kv.transpose(0, 1, 2, 4, 3, 5)                        # page [H][N][C]
    if layout.startswith("L"):
        kv = kv.transpose(1, 0, 2, 3, 4, 5)                        # chunk, layer, blk, page
    else:
        kv = kv.transpose(1, 2, 0, 3, 4, 5)                        # chunk, blk, layer, page
    return np.ascontiguousarray(kv).reshape(c, -1).view(np.int8)


def offload_config(model: str, layers: int, block: int, per_chunk: int, page_bytes: int,
                   layout: str):
    from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig,
                                           OffloadingGroupConfig, OffloadingModelConfig,
                                           OffloadingParallelConfig)
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(block, tuple(f"model.layers.{i}.self_attn.attn"
                                                   for i in range(layers)), 0),),
        worker_kv_bytes_per_block=layers * page_bytes, enable_kv_cache_events=False,
        extra_config={"cpu_bytes_to_use": 1 << 30, "secondary_tiers": []}, engine_id="bench",
        model=OffloadingModelConfig(model, "float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=block, blocks_per_chunk=per_chunk),
        parallel=OffloadingParallelConfig(rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1,
                                          dcp_size=1, data_parallel_index=0, data_parallel_size=1,
                                          data_parallel_rank_local=None,
                                          is_parallelism_agnostic=True),
        kv_cache_layout=layout)


def make_tier(tier_config: dict, view: memoryview, cfg):
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
    return SecondaryTierFactory.create_secondary_tier(dict(tier_config), view,
                                                      TieringOffloadingSpec(cfg))


def run_jobs(tier, keys, chunks, load: bool, job_chunks: int, first_id: int) -> tuple:
    """Submits the chunks as jobs, waits for all; returns (seconds, results)."""
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.tiering.base import TransferJob
    rc = ReqContext(req_id=f"bench{first_id}")
    jobs = {}
    t0 = time.perf_counter()
    for j, i in enumerate(range(0, len(keys), job_chunks)):
        job = TransferJob(first_id + j, keys[i:i + job_chunks],
                          np.asarray(chunks[i:i + job_chunks], dtype=np.int64), load, rc)
        jobs[job.job_id] = job
        (tier.submit_load if load else tier.submit_store)(job)
    results = []
    while len(results) < len(jobs):
        results += list(tier.get_finished_jobs())
        if len(results) < len(jobs):
            time.sleep(0.0005)
    return time.perf_counter() - t0, results


def lookup_all(tier, keys) -> list:
    """vLLM's two-step lookup: ask, end the step (flush), ask again until no RETRY."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext
    rc = ReqContext(req_id="lookup")
    tier.on_new_request(rc)
    out = [LookupResult.RETRY] * len(keys)
    for _ in range(2000):
        out = [tier.lookup(k, rc) for k in keys]
        if LookupResult.RETRY not in out:
            break
        tier.on_schedule_end(ScheduleEndContext((), ()))
        time.sleep(0.002)
    tier.on_request_finished(rc)
    return [r.name for r in out]


def dir_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def nmse(rows: np.ndarray, src: np.ndarray) -> float:
    x = src.view(np.float16).astype(np.float64)
    y = rows.view(np.float16).astype(np.float64)
    return float(((y - x) ** 2).sum() / (x ** 2).sum())


def one_round(name: str, tier_config: dict, buf: np.ndarray, n: int, cfg, keys, a, rnd: int,
              r: dict):
    """Stores every chunk into a fresh directory, loads them into the other rows; appends the
    times to r. Returns the tier (kept open after the last round for the checks)."""
    root = Path(tier_config.get("root_dir") or tier_config["store"])
    shutil.rmtree(root, ignore_errors=True)
    tier = make_tier(tier_config, memoryview(buf), cfg)
    s, res = run_jobs(tier, keys, list(range(n)), False, a.job_chunks, 1000 * rnd)
    assert all(x.success for x in res), (name, res)
    r.setdefault("store_s", []).append(round(s, 4))
    r["bytes_stored"] = dir_bytes(root)
    buf[n:2 * n] = 0
    s, res = run_jobs(tier, keys, list(range(n, 2 * n)), True, a.job_chunks, 1000 * rnd + 500)
    assert all(x.success for x in res), (name, res)
    r.setdefault("load_s", []).append(round(s, 4))
    return tier


def finish(name: str, tier, tier_config: dict, buf: np.ndarray, n: int, cfg, keys, a,
           r: dict) -> None:
    """Medians, exactness and error of the last round's load, lookups, the fault checks."""
    src, dst = buf[:n], buf[n:2 * n]
    kv_bytes = src.nbytes
    r.update({"kv_bytes": kv_bytes, "ratio": round(kv_bytes / r["bytes_stored"], 3),
              "store_gbps": round(kv_bytes / statistics.median(r["store_s"]) / 1e9, 3),
              "load_gbps": round(kv_bytes / statistics.median(r["load_s"]) / 1e9, 3),
              "bit_exact": bool(np.array_equal(src, dst)), "nmse": nmse(dst, src)})
    r["lookup"] = sorted(set(lookup_all(tier, keys)))
    log(f"{name}: {r['bytes_stored'] / 1e6:.2f} MB ({r['ratio']}x), store {r['store_gbps']} "
        f"GB/s, load {r['load_gbps']} GB/s, exact {r['bit_exact']}, nmse {r['nmse']:.4g}")
    r.update(corrupt_and_foreign(name, tier, tier_config, buf, n, cfg, keys, a))
    tier.shutdown()


def corrupt_and_foreign(name, tier, tier_config, buf, n, cfg, keys, a) -> dict:
    """One chunk's stored bytes corrupted: does a load of all chunks report it, and is that chunk
    among those reported loaded? Another model's object under a key: is it a miss, and does a
    load refuse it before writing its row?"""
    root = Path(tier_config.get("root_dir") or tier_config["store"])
    victim_key = keys[n // 2]
    victim = Path(tier.file_mapper.get_file_name(victim_key)) if tier_config["type"] == "fs" \
        else Path(root, tier.object_key(victim_key) + ".tqkv")
    data = bytearray(victim.read_bytes())
    data[len(data) * 2 // 3] ^= 0x5A
    victim.write_bytes(bytes(data))
    buf[n:2 * n] = 0
    _, res = run_jobs(tier, keys, list(range(n, 2 * n)), True, len(keys), 90000)
    ok = res[0].success
    loaded = set(keys) if ok else set(res[0].successful_keys or ())
    row = n + n // 2
    out = {"corrupt_load_reported": not ok, "corrupt_chunk_reported_loaded": victim_key in loaded,
           "corrupt_row_differs_from_source": bool(not np.array_equal(buf[n // 2], buf[row]))}
    if tier_config["type"] == "fs":
        return out
    other = dict(tier_config, store=str(root))
    ocfg = offload_config("another-model", *a.geo)
    otier = make_tier(other, memoryview(buf), ocfg)
    key = keys[0]
    src, dst_name = Path(root, tier.object_key(key) + ".tqkv"), otier.object_key(key) + ".tqkv"
    Path(root, dst_name).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(src, Path(root, dst_name))  # a collision: the other model's key holds our chunk
    out["foreign_lookup"] = lookup_all(otier, [key])[0]
    buf[n] = 0
    _, res = run_jobs(otier, [key], [n], True, 1, 95000)
    out["foreign_load_refused"] = not res[0].success
    out["foreign_row_untouched"] = bool(not buf[n].any())
    otier.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kv-store", required=True)
    ap.add_argument("--model", default="real-kv", help="model name in the tiers' identity")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--blocks-per-chunk", type=int, default=1)
    ap.add_argument("--layout", default="NHD")
    ap.add_argument("--codecs", default="fp16,tq3",
                    help="tqkv tier variants: CODEC[:KEY=VALUE;...] (tier config), e.g. "
                         "tq3:key_means=off")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--job-chunks", type=int, default=16)
    ap.add_argument("--work", default="")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    from tqkv.vllm import offload_layout as ol
    layout = ol.resolve_layout(a.layout)
    k, v = real_kv(a.kv_store, a.tokens)
    L, T, H, D = k.shape
    rows = to_rows(k, v, layout, a.block, a.blocks_per_chunk)
    n = rows.shape[0]
    page = H * a.block * 2 * D * 2
    a.geo = (L, a.block, a.blocks_per_chunk, page, layout)
    cfg = offload_config(a.model, *a.geo)
    # Page-aligned like vLLM's mmap'd primary tier (the fs tier reads and writes with O_DIRECT).
    region = mmap.mmap(-1, (2 * n + 1) * rows.shape[1])
    buf = np.frombuffer(region, dtype=np.int8).reshape(2 * n + 1, rows.shape[1])
    buf[:n] = rows
    keys = [i.to_bytes(32, "big") + b"\0\0\0\0" for i in range(n)]
    work = Path(a.work or tempfile.mkdtemp(prefix="tqkv-tier-"))
    log(f"{cpu_name()}; {n} chunks of {a.block * a.blocks_per_chunk} tokens, L={L} H={H} D={D}, "
        f"{layout}, {rows.nbytes / 1e6:.1f} MB of KV in {work}")
    out = {"cpu": cpu_name(), "tokens": n * a.block * a.blocks_per_chunk, "layers": L,
           "kv_heads": H, "head_dim": D, "block": a.block, "blocks_per_chunk": a.blocks_per_chunk,
           "layout": layout, "job_chunks": a.job_chunks, "rounds": a.rounds, "tiers": {}}
    import tqkv
    configs = {"fs": {"type": "fs", "root_dir": str(work / "fs")}}
    for variant in [c for c in a.codecs.split(",") if c]:
        codec, _, opts = variant.partition(":")  # e.g. tq3:key_means=off
        conf = {"type": "TqkvTier", "module_path": "tqkv.vllm", "store": str(work / variant),
                "codec": codec, "kv_heads": H, "head_dim": D}
        conf.update(o.split("=", 1) for o in opts.split(";") if o)
        configs[f"tqkv-{variant}"] = conf
    # Rounds interleave the tiers, so a change in the machine's load touches them all alike.
    results = {name: {} for name in configs}
    tiers = {}
    for rnd in range(a.rounds):
        for name, conf in configs.items():
            if name in tiers:
                tiers[name].shutdown()
            tiers[name] = one_round(name, conf, buf, n, cfg, keys, a, rnd, results[name])
        log(f"round {rnd + 1}/{a.rounds}: " + ", ".join(
            f"{name} {r['store_s'][-1]:.3f}/{r['load_s'][-1]:.3f} s" for name, r in
            results.items()))
    tokens = out["tokens"]
    for name, conf in configs.items():
        # the last round's load again, alone, so the checks see this tier's bytes
        buf[n:2 * n] = 0
        _, res = run_jobs(tiers[name], keys, list(range(n, 2 * n)), True, a.job_chunks, 80000)
        assert all(x.success for x in res), (name, res)
        r = results[name]
        finish(name, tiers[name], conf, buf, n, cfg, keys, a, r)
        if conf["type"] == "fs":
            out["tiers"][name] = r
            continue
        # The library on the same tokens as one session: its bytes and error.
        ref_key = re.sub(r"[^A-Za-z0-9._-]", "_", name)
        ref = tqkv.checkpoint(str(work / "ref"), ref_key, k[:, :tokens], v[:, :tokens],
                              codec=conf["codec"], exact_tokens=(0, 0),
                              key_means=conf.get("key_means"), guard=False, alignment=64)
        rk, rv = tqkv.restore(str(work / "ref"), ref_key, dtype="float16")
        x = np.concatenate([k[:, :tokens], v[:, :tokens]]).astype(np.float64)
        y = np.concatenate([rk, rv]).astype(np.float64)
        r["checkpoint_bytes"] = int(ref["bytes_written"])
        r["checkpoint_nmse"] = float(((y - x) ** 2).sum() / (x ** 2).sum())
        r["vs_checkpoint_bytes"] = round(r["bytes_stored"] / r["checkpoint_bytes"], 3)
        r["vs_fs_bytes"] = round(results["fs"]["bytes_stored"] / r["bytes_stored"], 3)
        r["vs_fs_load"] = round(r["load_gbps"] / results["fs"]["load_gbps"], 3)
        out["tiers"][name] = r
    text = json.dumps(out, indent=1)
    if a.json:
        Path(a.json).write_text(text + "\n")
    print(text)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

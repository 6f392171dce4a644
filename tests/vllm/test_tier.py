"""tqkv.vllm.TqkvTier, the tier for vLLM's own offloading (OffloadingConnector + tiering): vLLM's
offload rows read as the library's paged views, the tier built by vLLM's factory from its spec
config, and the harness (scripts/bench_vllm_tier.py) beside vLLM's `fs` tier on the KV vLLM
computed for a real model (the fp16 chunks of conftest's fp16_run).

    PY=$(scripts/setup-vllm.sh) && PYTHONPATH=build/python $PY -m pytest -q tests/vllm/test_tier.py
"""
import dataclasses
import json
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run scripts/setup-vllm.sh and use its python")
torch = pytest.importorskip("torch")

from vllm_helpers import ROOT  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
import bench_vllm_tier as harness  # noqa: E402

from tqkv.vllm import offload_layout as ol  # noqa: E402

LAYOUTS = ["LBNHC", "LBHNC", "BLNHC", "BLHNC"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("per_chunk,world", [(1, 1), (3, 1), (2, 2)])
def test_views_address_vllms_rows(layout, per_chunk, world):
    # rows written by the harness's own reshape of vLLM's layouts, read through host_kv's views
    L, H, D, N, chunks = 3, 2, 16, 4, 5
    rng = np.random.default_rng(7)
    parts, kv = [], []
    for _ in range(world):
        k = rng.standard_normal((L, chunks * N * per_chunk, H, D)).astype(np.float16)
        v = rng.standard_normal(k.shape).astype(np.float16)
        parts.append(harness.to_rows(k, v, layout, N, per_chunk))
        kv.append((k, v))
    rows = np.concatenate(parts, axis=1)
    page = H * N * 2 * D * 2
    pad = page if layout[0] == "L" else L * page  # vLLM pads rows (to its page size)
    buf = np.zeros((chunks, rows.shape[1] + pad), dtype=np.int8)
    buf[:, :rows.shape[1]] = rows
    for rank in range(world):
        g = ol.geometry(layers=L, kv_heads=H, head_dim=D, block_tokens=N,
                        blocks_per_chunk=per_chunk, dtype="float16", layout=layout,
                        row_bytes=buf.shape[1], worker_kv_bytes_per_block=L * page, rank=rank,
                        world_size=world)
        views = ol.host_kv(memoryview(buf), g)
        k, v = kv[rank]
        for c in range(chunks):
            ids = g.block_ids(c)
            for layer in range(L):
                for which, src in (("k", k), ("v", v)):
                    got = views[which][layer][torch.from_numpy(ids)]
                    if views["layout"] == "paged_hnd":
                        got = got.transpose(1, 2)
                    got = got.reshape(-1, H, D).numpy()
                    want = src[layer, c * N * per_chunk:(c + 1) * N * per_chunk]
                    assert np.array_equal(got, want), (layout, rank, c, layer, which)


def test_geometry_refuses_what_it_cannot_store():
    ok = dict(layers=2, kv_heads=2, head_dim=64, block_tokens=16, blocks_per_chunk=1,
              dtype="float16", layout="NHD", row_bytes=2 * 8192,
              worker_kv_bytes_per_block=2 * 8192)
    assert ol.geometry(**ok).layout == "LBNHC"
    with pytest.raises(ValueError, match="not plain K and V"):
        ol.geometry(**dict(ok, worker_kv_bytes_per_block=2 * 8192 + 64))  # e.g. MLA, fp8 scales
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        ol.geometry(**dict(ok, dtype="fp8_e4m3"))
    with pytest.raises(ValueError, match="block-compact"):
        ol.geometry(**dict(ok, layout="LHBNC"))
    with pytest.raises(ValueError, match="whole blocks"):
        ol.geometry(**dict(ok, row_bytes=2 * 8192 + 64))
    a = ol.identity(ol.geometry(**ok), "/models/a")
    assert a != ol.identity(ol.geometry(**ok), "/models/b")
    assert a != ol.identity(ol.geometry(**dict(ok, layout="HND")), "/models/a")
    assert len(a.encode()) <= 256


def test_vllms_spec_builds_the_tier_from_its_config(tmp_path):
    # TieringOffloadingSpec parses secondary_tiers and SecondaryTierFactory imports the tier by
    # type + module_path, over the real CPU primary tier (its shared mmap region)
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
    page = 2 * 16 * 2 * 64 * 2
    cfg = harness.offload_config("m", 4, 16, 1, page, "NHD")
    tiers = [{"type": "TqkvTier", "module_path": "tqkv.vllm", "store": str(tmp_path / "s"),
              "codec": "tq3", "kv_heads": 2, "head_dim": 64,
              "backpressure": {"backpressure_cls": "EMABackpressureDetector"}}]
    cfg = dataclasses.replace(cfg, extra_config={"cpu_bytes_to_use": 4 << 20,
                                                 "secondary_tiers": tiers})
    defs = TieringOffloadingSpec.build_metric_definitions(cfg.extra_config)
    assert "vllm:kv_offload_tqkv_write_bytes" in defs
    manager = TieringOffloadingSpec(cfg).get_manager()
    try:
        (tier,) = manager.secondary_tiers
        assert type(tier).__name__ == "TqkvTier" and tier.bp_detector is not None
        assert "L=4 H=2 D=64 N=16x1 float16 LBNHC rank=0/1" in tier.identity
    finally:
        manager.shutdown()


@pytest.mark.parametrize("layout,per_chunk", [("HND", 16), ("NHD", 1)])
def test_harness_beside_vllms_fs_tier(fp16_run, tmp_path, layout, per_chunk):
    out = tmp_path / "tier.json"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_vllm_tier.py"),
                        "--kv-store", str(fp16_run["store"]), "--tokens", "512", "--rounds", "1",
                        "--layout", layout, "--blocks-per-chunk", str(per_chunk),
                        "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    print("\n".join(x for x in r.stderr.splitlines() if x.startswith("bench_vllm_tier")))
    t = json.loads(out.read_text())["tiers"]
    fs, fp16, tq3 = t["fs"], t["tqkv-fp16"], t["tqkv-tq3"]
    assert fs["bit_exact"] and fp16["bit_exact"] and fp16["nmse"] == 0
    # the tier's chunks decode to what the library's own session of the same tokens does
    assert tq3["nmse"] <= 1.25 * tq3["checkpoint_nmse"] + 1e-4
    assert tq3["vs_fs_bytes"] >= (4.0 if per_chunk == 16 else 3.4)
    for r in (fp16, tq3):
        assert r["lookup"] == ["HIT"]
        assert r["corrupt_load_reported"] and not r["corrupt_chunk_reported_loaded"]
        assert r["foreign_lookup"] == "MISS" and r["foreign_load_refused"]
        assert r["foreign_row_untouched"]


def _step(manager) -> None:
    """Scheduler steps until vLLM's manager has no transfer in flight."""
    from vllm.v1.kv_offload.base import ScheduleEndContext
    for _ in range(4000):
        manager.on_schedule_end(ScheduleEndContext((), ()))
        if not manager.has_pending_work():
            return
        time.sleep(0.002)
    raise AssertionError("the offloading manager's transfers did not finish")


@pytest.mark.parametrize("codec", ["fp16", "tq3"])
def test_vllms_manager_cascades_to_the_tier_and_promotes_back(tmp_path, codec):
    # The returning user on vLLM's own scheduler-side offloading (TieringOffloadingManager, its
    # CPU primary tier in shared memory), with the GPU's copies played by the test: request 1's
    # chunks are stored in the primary tier, cascaded to the tqkv tier, the primary tier is
    # reset; request 2's lookups find them in the tier, vLLM promotes them, and the primary
    # slots it then reads hold request 1's KV (fp16: bit for bit).
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
    L, H, D, N, n = 4, 2, 64, 16, 6
    page = H * N * 2 * D * 2
    tiers = [{"type": "TqkvTier", "module_path": "tqkv.vllm", "store": str(tmp_path / "s"),
              "codec": codec, "kv_heads": H, "head_dim": D}]
    cfg = dataclasses.replace(harness.offload_config("m", L, N, 1, page, "NHD"),
                              extra_config={"cpu_bytes_to_use": 16 * L * page,
                                            "secondary_tiers": tiers})
    manager = TieringOffloadingSpec(cfg).get_manager()
    try:
        primary = np.frombuffer(manager.primary_tier.get_kv_memoryview(), dtype=np.int8)
        primary = primary.reshape(-1, L * page)
        rng = np.random.default_rng(3)
        k = rng.standard_normal((L, n * N, H, D)).astype(np.float16)
        v = rng.standard_normal(k.shape).astype(np.float16)
        rows = harness.to_rows(k, v, "LBNHC", N, 1)
        keys = [bytes([i + 1]) * 32 + b"\0\0\0\0" for i in range(n)]

        r1 = ReqContext(req_id="turn1")
        manager.on_new_request(r1)
        out = manager.prepare_store(keys, r1)
        assert list(out.keys_to_store) == keys
        for key, chunk in zip(keys, out.store_spec.chunk_ids):  # the GPU -> CPU copies
            primary[int(chunk)] = rows[keys.index(key)]
        manager.complete_store(keys, r1)  # cascades to the tier
        manager.on_request_finished(r1)
        _step(manager)
        (tier,) = manager.secondary_tiers
        assert all(tier.present(key) for key in keys)
        manager.reset_cache()  # the primary tier forgets
        primary[:] = 0

        r2 = ReqContext(req_id="turn2")
        manager.on_new_request(r2)
        for _ in range(4000):
            got = [manager.lookup(key, r2) for key in keys]
            if all(x is LookupResult.HIT for x in got):
                break
            assert LookupResult.MISS not in got, got
            manager.on_schedule_end(ScheduleEndContext((), ()))  # flushes lookups, promotes
            time.sleep(0.002)
        assert all(x is LookupResult.HIT for x in got), got
        spec = manager.prepare_load(keys, r2)
        loaded = np.stack([primary[int(c)] for c in spec.chunk_ids])
        manager.complete_load(keys, r2)
        manager.on_request_finished(r2)
        if codec == "fp16":
            assert np.array_equal(loaded, rows)
        else:
            x = rows.view(np.float16).astype(np.float64)
            y = loaded.view(np.float16).astype(np.float64)
            assert ((y - x) ** 2).sum() / (x ** 2).sum() < 0.05  # tq3 on Gaussian: 0.034
        stats = manager.get_stats()
        assert stats is not None
        del primary  # the shared region closes only when nothing maps it
    finally:
        manager.shutdown()


def test_touch_pins_and_gc_evicts_the_rest(tmp_path):
    # max_bytes: after a store job the store's gc evicts least recently used unpinned chunks;
    # touch pinned the first ones, so they stay; an evicted chunk is a miss (even for the tier
    # that stored it) and fails a load
    L, H, D, N, n = 2, 2, 64, 16, 8
    page = H * N * 2 * D * 2
    cfg = harness.offload_config("m", L, N, 1, page, "NHD")
    region = np.zeros((2 * n, L * page), dtype=np.int8)
    region[:n] = np.random.default_rng(1).standard_normal((n, L * page // 2)).astype(
        np.float16).view(np.int8)
    keys = [bytes([i + 1]) * 32 + b"\0\0\0\0" for i in range(n)]
    conf = {"type": "TqkvTier", "module_path": "tqkv.vllm", "store": str(tmp_path / "s"),
            "codec": "fp16", "kv_heads": H, "head_dim": D, "pin_s": 600, "gc_interval_s": 0}
    probe = harness.make_tier(conf, memoryview(region), cfg)
    harness.run_jobs(probe, keys[:1], [0], False, 1, 1)
    one = harness.dir_bytes(tmp_path / "s")
    probe.shutdown()
    conf["max_bytes"] = int(4.5 * one)  # room for 4 chunks
    tier = harness.make_tier(conf, memoryview(region), cfg)
    _, res = harness.run_jobs(tier, keys[:4], list(range(4)), False, 4, 10)
    assert res[0].success
    from vllm.v1.kv_offload.base import ReqContext
    tier.touch(keys[:2], ReqContext(req_id="t"))
    time.sleep(1.1)  # the gc's recency is by the second
    _, res = harness.run_jobs(tier, keys[4:], list(range(4, n)), False, 4, 20)
    assert res[0].success
    found = harness.lookup_all(tier, keys)
    # 8 chunks, room for 4: the 2 pinned ones count, the 2 older unpinned ones go first, then 2
    # of the second job's 4 (written together, within the second the gc orders recency by)
    assert found[:4] == ["HIT", "HIT", "MISS", "MISS"], found
    assert sorted(found[4:]) == ["HIT", "HIT", "MISS", "MISS"], found
    _, res = harness.run_jobs(tier, keys[2:4], [n + 2, n + 3], True, 2, 30)
    assert not res[0].success and not res[0].successful_keys
    tier.shutdown()

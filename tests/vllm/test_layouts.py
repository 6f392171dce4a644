"""The connector's worker side on every vLLM cache layout, without a server: vLLM's CUDA layouts
(5-D [2, blocks, 16, heads, dim] NHD and [2, blocks, heads, 16, dim] HND, block size 16) as host
tensors, and its CPU layouts ([blocks, heads, block, 2 * dim], filled element by element in the
order each attention ISA's reshape_and_cache writes: vLLM 0.32 csrc/cpu/cpu_attn_vec.hpp,
cpu_attn_amx.hpp). Chunks saved by the writer and restored by the loader (one library call each)
are bit-exact against a plain restore of each chunk, and the chunks of a prompt take within 3 %
of one `tqkv.checkpoint` of the same tokens."""
import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tqkv  # noqa: E402
from tqkv.vllm import Stats, default_chunk_tokens  # noqa: E402
from tqkv.vllm.worker import Loader, paged_kv  # noqa: E402
from tqkv.vllm.writer import ChunkOp, ChunkWriter  # noqa: E402

LAYERS, HEADS, DIM = 4, 2, 64
log = logging.getLogger("test")


def names():
    return [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]


def cuda_shaped(layout, blocks, block, gen):
    shape = (2, blocks, block, HEADS, DIM) if layout == "nhd" else (2, blocks, HEADS, block, DIM)
    return {n: torch.randn(*shape, generator=gen).to(torch.bfloat16) for n in names()}


def cpu_offsets(isa, block):
    """Element offsets of (token t, channel c) in a block and head's K and V halves."""
    t = torch.arange(block).view(block, 1)
    c = torch.arange(DIM).view(1, DIM)
    if isa == "amx":
        ko = (t // 16) * 16 * DIM + (c // 2) * 32 + (t % 16) * 2 + c % 2
        vo = (c // 16) * block * 16 + (t // 2) * 32 + (c % 16) * 2 + t % 2
    else:
        ko, vo = c * block + t, t * DIM + c
    return ko.reshape(-1), block * DIM + vo.reshape(-1)


def cpu_filled(isa, blocks, block, gen):
    """A CPU cache as `isa`'s kernels lay out token t, channel c (the test's own formulas)."""
    out = {}
    ko, vo = cpu_offsets(isa, block)
    for n in names():
        k = torch.randn(blocks, HEADS, block, DIM, generator=gen).to(torch.bfloat16)
        v = torch.randn(blocks, HEADS, block, DIM, generator=gen).to(torch.bfloat16)
        cache = torch.zeros(blocks, HEADS, block, 2 * DIM, dtype=torch.bfloat16)
        flat = cache.view(blocks, HEADS, 2 * block * DIM)
        flat[:, :, ko] = k.reshape(blocks, HEADS, -1)
        flat[:, :, vo] = v.reshape(blocks, HEADS, -1)
        out[n] = cache
    return out


def logical(layers, kind, ids, block):
    """[layers, 2, tokens, heads, dim] of blocks `ids`, read with the test's own indexing."""
    res = []
    for n in names():
        x = layers[n]
        if kind == "nhd":
            kv = x[:, ids].reshape(2, -1, HEADS, DIM)
        elif kind == "hnd":
            kv = x[:, ids].transpose(2, 3).reshape(2, -1, HEADS, DIM)
        else:  # a CPU order: [blocks, heads, block, 2 * dim]
            ko, vo = cpu_offsets(kind, block)
            flat = x[ids].reshape(len(ids), HEADS, -1)
            halves = [flat[:, :, o].view(len(ids), HEADS, block, DIM).transpose(1, 2)
                      .reshape(-1, HEADS, DIM) for o in (ko, vo)]
            kv = torch.stack(halves)
        res.append(kv)
    return torch.stack(res)


CASES = [("nhd", 16, "cuda"), ("hnd", 16, "cuda"), ("vec", 32, "cpu"), ("amx", 32, "cpu"),
         ("vec", 128, "cpu")]


@pytest.mark.parametrize("kind, block, device", CASES)
@pytest.mark.parametrize("codec", ["bf16", "tq3"])
def test_save_and_restore_match_plain_restores(tmp_path, kind, block, device, codec):
    gen = torch.Generator().manual_seed(5)
    chunk = default_chunk_tokens(block)
    per = chunk // block
    n_chunks = 3
    blocks = n_chunks * per + 5
    src = (cuda_shaped(kind, blocks, block, gen) if device == "cuda"
           else cpu_filled(kind, blocks, block, gen))
    geo = {"layers": LAYERS, "kv_heads": HEADS, "head_dim": DIM}
    kv, order, what = paged_kv(src, geo, block, chunk, kind if device == "cpu" else "")
    assert order == names()
    store = tqkv.open_store(str(tmp_path / "s"))
    rng = np.random.default_rng(0)
    perm = rng.permutation(blocks)
    ids = [list(map(int, perm[i * per:(i + 1) * per])) for i in range(n_chunks)]
    ops = [ChunkOp(f"c{i}", f"model c{i}", ids[i], "r", i * chunk) for i in range(n_chunks)]
    stats = Stats()
    w = ChunkWriter(store, {"codec": codec}, stats, threaded=False, log=log)
    w.submit(ops, kv)
    assert stats.snapshot()["chunks_saved"] == n_chunks and stats.snapshot()["errors"] == 0

    dst = {n: torch.zeros_like(x) for n, x in src.items()}
    kv2, _, _ = paged_kv(dst, geo, block, chunk, kind if device == "cpu" else "")
    pool = list(map(int, rng.permutation(blocks)))
    out_ids = [pool[i * per:(i + 1) * per] for i in range(n_chunks)]
    loads = [ChunkOp(op.key, op.model, out_ids[i], "r") for i, op in enumerate(ops)]
    ld = Loader(store, stats, log)
    ld.start(loads, kv2)
    for layer in range(LAYERS):
        ld.wait_layer(layer)
    assert ld.take_failed() == set()
    for i in range(n_chunks):
        k, v = tqkv.restore(store, f"c{i}", dtype="bfloat16", array="torch")
        got = logical(dst, kind, out_ids[i], block)
        assert torch.equal(got[:, 0].view(torch.int16), k.view(torch.int16)), (kind, i)
        assert torch.equal(got[:, 1].view(torch.int16), v.view(torch.int16)), (kind, i)
        if codec == "bf16":  # exact: the source's own blocks
            assert torch.equal(logical(src, kind, ids[i], block), got)
    used = {b for ids_ in out_ids for b in ids_}
    for n in names():  # blocks of no chunk: untouched
        rest = [b for b in range(blocks) if b not in used]
        assert not (dst[n][:, rest] if device == "cuda" else dst[n][rest]).any()
@pytest.mark.parametrize("kind, block, device", [("nhd", 16, "cuda"), ("vec", 32, "cpu"),
                                                 ("vec", 128, "cpu")])
def test_chunks_keep_the_codecs_ratio(tmp_path, kind, block, device):
    """A 1,024-token prompt stored as default chunks takes within 3 % of one checkpoint of the
    same tokens with the same codec (exact tokens off in both: the chunk has no tail)."""
    gen = torch.Generator().manual_seed(6)
    chunk = default_chunk_tokens(block)
    tokens = 1024
    per, n_chunks = chunk // block, tokens // chunk
    blocks = tokens // block
    src = (cuda_shaped(kind, blocks, block, gen) if device == "cuda"
           else cpu_filled(kind, blocks, block, gen))
    geo = {"layers": LAYERS, "kv_heads": HEADS, "head_dim": DIM}
    kv, _, _ = paged_kv(src, geo, block, chunk, kind if device == "cpu" else "")
    store = tqkv.open_store(str(tmp_path / "s"))
    ops = [ChunkOp(f"c{i}", "m", list(range(i * per, (i + 1) * per)), "r", i * chunk)
           for i in range(n_chunks)]
    w = ChunkWriter(store, {"codec": "tq3"}, Stats(), threaded=False, log=log)
    w.submit(ops, kv)
    chunks = sum(store.size(f"c{i}") for i in range(n_chunks))
    # the same tokens, one session, from the restored chunks' canonical arrays
    ks, vs = zip(*(tqkv.restore(store, f"c{i}", dtype="bfloat16", array="torch")
                   for i in range(n_chunks)))
    k, v = torch.cat(ks, dim=1), torch.cat(vs, dim=1)
    tqkv.checkpoint(store, "whole", k, v, codec="tq3", exact_tokens=(0, 0))
    whole = store.size("whole")
    print(f"{kind} block {block}: {n_chunks} chunks of {chunk}: {chunks} bytes, one session "
          f"{whole} bytes: {chunks / whole:.4f}x")
    assert chunks <= 1.03 * whole

"""Restores into the engines' layouts decode straight into the caller's memory: transposed
(``layout="hnd"``) and paged blocks (shuffled, non-contiguous block ids, a partial last block),
with key means and exact rows on, equal bit for bit to the canonical restore; strided channels
still work, through staging."""
import numpy as np
import pytest

import tqkv
from conftest import session_arrays

OPTS = dict(codec="tq3", key_means="16", exact_tokens=(3, 5), token_block=24)


@pytest.fixture
def canon(store):
    k, v = session_arrays(layers=3, tokens=50, heads=2, dim=64, dtype=np.float16, seed=7)
    tqkv.checkpoint(store, "s", k, v, **OPTS)
    assert store.header("s")["key_mean_block"] == 16
    return tqkv.restore(store, "s")


def test_hnd_restore_writes_the_callers_arrays_in_place(store, canon):
    ck, cv = canon
    layers, tokens, heads, dim = ck.shape
    ko = np.zeros((layers, heads, tokens, dim), np.float16)
    vo = np.zeros_like(ko)
    ptrs = (ko.ctypes.data, vo.ctypes.data)
    seen = []

    def on_layer(layer, kl, vl):
        assert kl.ctypes.data == ko[layer].ctypes.data  # the caller's memory, already filled
        assert np.array_equal(kl.transpose(1, 0, 2), ck[layer])
        seen.append(layer)

    stats = {}
    rk, rv = tqkv.restore(store, "s", out=(ko, vo), layout="hnd", on_layer=on_layer, stats=stats)
    assert stats["staged"] is False
    assert rk is ko and rv is vo and (ko.ctypes.data, vo.ctypes.data) == ptrs
    assert seen == [0, 1, 2]
    assert np.array_equal(ko.transpose(0, 2, 1, 3), ck)  # bit for bit (NaN-free f16)
    assert np.array_equal(vo.transpose(0, 2, 1, 3), cv)
    nk, _ = tqkv.restore(store, "s", layout="hnd", stats=stats)  # new arrays: in place too
    assert stats["staged"] is False and np.array_equal(nk, ko)


def test_hnd_view_of_a_bhnd_tensor(store, canon):
    # transformers' [batch, kv_heads, tokens, head_dim] with batch 2: batch 1's view per layer
    ck, _ = canon
    layers, tokens, heads, dim = ck.shape
    big = [np.zeros((2, heads, tokens, dim), np.float16) for _ in range(layers)]
    bigv = [np.zeros_like(b) for b in big]
    stats = {}
    tqkv.restore(store, "s", out=([b[1] for b in big], [b[1] for b in bigv]), layout="hnd",
                 stats=stats)
    assert stats["staged"] is False
    for layer in range(layers):
        assert np.array_equal(big[layer][1].transpose(1, 0, 2), ck[layer])
        assert not big[layer][0].any()  # batch 0 untouched


@pytest.mark.parametrize("bs", [16, 7])
def test_paged_restore_decodes_into_the_blocks(store, canon, bs):
    ck, cv = canon
    layers, tokens, heads, dim = ck.shape
    nblocks = -(-tokens // bs)  # the last block partial (50 = 3*16 + 2 = 7*7 + 1)
    pool_blocks = nblocks + 4
    ids = np.random.default_rng(bs).permutation(pool_blocks)[:nblocks]
    ids_view = np.empty(2 * nblocks, np.int64)[::2]  # a non-contiguous id array
    ids_view[:] = ids
    kp = np.full((layers, pool_blocks, bs, heads, dim), 7.0, np.float16)
    vp = np.full_like(kp, 7.0)
    ptrs = (kp.ctypes.data, vp.ctypes.data)
    stats = {}
    tqkv.restore(store, "s", out=(kp, vp), layout="paged", block_ids=ids_view, tokens=tokens,
                 stats=stats)
    assert stats["staged"] is False and (kp.ctypes.data, vp.ctypes.data) == ptrs
    for i, b in enumerate(ids):
        n = min(bs, tokens - i * bs)
        assert np.array_equal(kp[:, b, :n], ck[:, i * bs:i * bs + n])
        assert np.array_equal(vp[:, b, :n], cv[:, i * bs:i * bs + n])
        assert (kp[:, b, n:] == 7).all()  # the partial block's tail untouched
    unused = sorted(set(range(pool_blocks)) - set(ids.tolist()))
    assert (kp[:, unused] == 7).all() and (vp[:, unused] == 7).all()


def test_strided_channels_are_staged(store, canon):
    ck, _ = canon
    layers, tokens, heads, dim = ck.shape
    # [tokens, kv_heads, head_dim] views whose channels are every other element
    kb = np.zeros((layers, tokens, heads, 2 * dim), np.float16)
    vb = np.zeros_like(kb)
    stats = {}
    tqkv.restore(store, "s", out=(kb[..., ::2], vb[..., ::2]), stats=stats)
    assert stats["staged"] is True
    assert np.array_equal(kb[..., ::2], ck) and not kb[..., 1::2].any()

"""Checkpoint/restore of numpy caches: layouts (canonical, transposed, paged), out= in place,
layer by layer, per-layer codecs and exact tokens, store admin, decode parity with the CLI."""
import subprocess

import numpy as np
import pytest

import tqkv
from conftest import read_safetensors, session_arrays


def test_restore_into_out_writes_the_callers_memory(store):
    k, v = session_arrays(dtype=np.float16)
    st = tqkv.checkpoint(store, "s", k, v, codec="tq3", model="toy")
    assert st["staged"] is False  # the arrays were read in place
    assert st["bytes_written"] > 0 and st["fp16_bytes"] == k.nbytes * 2
    ko, vo = np.zeros_like(k), np.zeros_like(v)
    ptrs = (ko.ctypes.data, vo.ctypes.data)
    stats = {}
    rk, rv = tqkv.restore(store, "s", out=(ko, vo), stats=stats)
    assert rk is ko and rv is vo and (ko.ctypes.data, vo.ctypes.data) == ptrs
    assert stats["staged"] is False and stats["tokens"] == 40 and stats["model"] == "toy"
    nk, nv = tqkv.restore(store, "s")  # new arrays: the same values
    assert np.array_equal(nk, ko) and np.array_equal(nv, vo)
    assert nk.shape == k.shape and nk.dtype == np.float16
    assert np.corrcoef(ko.astype(np.float32).ravel(), k.astype(np.float32).ravel())[0, 1] > 0.95


def test_per_layer_lists_and_dtypes(store):
    k, v = session_arrays(layers=3, dtype=np.float32)
    tqkv.checkpoint(store, "s", list(k), list(v), codec="fp16")
    for dtype, np_type in (("float32", np.float32), ("float16", np.float16)):
        rk, _ = tqkv.restore(store, "s", dtype=dtype)
        assert rk.dtype == np_type
        assert np.array_equal(rk, k.astype(np.float16).astype(np_type))
    rk, _ = tqkv.restore(store, "s", dtype="bfloat16")
    assert rk.dtype.itemsize == 2
    assert np.allclose(np.asarray(rk, dtype=np.float32) if rk.dtype != np.uint16
                       else (rk.astype(np.uint32) << 16).view(np.float32), k, rtol=1e-2)


def test_transposed_layout_matches_canonical(store):
    k, v = session_arrays(dtype=np.float16)
    tqkv.checkpoint(store, "canon", k, v, codec="tq2.5")
    kt = np.ascontiguousarray(k.transpose(0, 2, 1, 3))  # [layers, heads, tokens, dim]
    vt = np.ascontiguousarray(v.transpose(0, 2, 1, 3))
    st = tqkv.checkpoint(store, "hnd", kt, vt, codec="tq2.5", layout="hnd")
    assert st["staged"] is True
    assert store.inspect("canon") == store.inspect("hnd")
    ck, cv = tqkv.restore(store, "canon")
    hk, hv = tqkv.restore(store, "hnd", layout="hnd")
    assert hk.shape == kt.shape
    assert np.array_equal(hk.transpose(0, 2, 1, 3), ck)
    assert np.array_equal(hv.transpose(0, 2, 1, 3), cv)


def test_paged_blocks(store):
    k, v = session_arrays(tokens=40, dtype=np.float16)
    layers, tokens, heads, dim = k.shape
    bs, ids = 16, np.array([4, 0, 2])  # 40 tokens in 3 blocks of a 5-block pool
    kp = np.zeros((layers, 5, bs, heads, dim), np.float16)
    vp = np.zeros_like(kp)
    for i, b in enumerate(ids):
        n = min(bs, tokens - i * bs)
        kp[:, b, :n] = k[:, i * bs:i * bs + n]
        vp[:, b, :n] = v[:, i * bs:i * bs + n]
    tqkv.checkpoint(store, "canon", k, v, codec="tq3")
    tqkv.checkpoint(store, "paged", kp, vp, codec="tq3", layout="paged", block_ids=ids,
                    tokens=tokens)
    assert store.inspect("paged")["tokens"] == tokens
    ck, cv = tqkv.restore(store, "canon")
    ko, vo = np.zeros_like(kp), np.zeros_like(vp)
    tqkv.restore(store, "paged", out=(ko, vo), layout="paged", block_ids=[3, 1, 4],
                 tokens=tokens)
    for i, b in enumerate([3, 1, 4]):
        n = min(bs, tokens - i * bs)
        assert np.array_equal(ko[:, b, :n], ck[:, i * bs:i * bs + n])
        assert np.array_equal(vo[:, b, :n], cv[:, i * bs:i * bs + n])
    assert not ko[:, 0].any() and not ko[:, 2].any()  # blocks outside the table untouched
    with pytest.raises(tqkv.InvalidArgumentError, match="block"):
        tqkv.checkpoint(store, "bad", kp, vp, layout="paged", block_ids=[0, 1, 9], tokens=40)


def test_layer_by_layer(store):
    k, v = session_arrays(layers=4, dtype=np.float16)
    tqkv.checkpoint(store, "s", k, v)
    whole, _ = tqkv.restore(store, "s")
    seen = []
    for layer, kl, vl in tqkv.restore_layers(store, "s"):
        assert np.array_equal(kl, whole[layer])
        seen.append(layer)
    assert seen == [0, 1, 2, 3]
    order = []
    ko, vo = np.zeros_like(k), np.zeros_like(v)

    def on_layer(layer, kl, vl):
        assert kl.ctypes.data == ko[layer].ctypes.data  # the caller's memory, filled
        assert np.array_equal(kl, whole[layer])
        order.append(layer)

    tqkv.restore(store, "s", out=(ko, vo), on_layer=on_layer)
    assert order == [0, 1, 2, 3]
    # Leaving the loop early stops the restore; raising in on_layer propagates.
    for layer, _, _ in tqkv.restore_layers(store, "s"):
        break

    def boom(layer, kl, vl):
        raise KeyError("stop at %d" % layer)

    with pytest.raises(KeyError, match="stop at 0"):
        tqkv.restore(store, "s", on_layer=boom)


def test_lossy_sessions_keep_the_last_tokens_exact_by_default(store):
    k, v = session_arrays(layers=2, tokens=32, dtype=np.float16)
    for key, kwargs, want in (("tq3", dict(codec="tq3"), {"first": 0, "last": 4}),
                              ("fp16", dict(codec="fp16"), {"first": 0, "last": 0}),
                              ("kv-raw", dict(codec="k:fp16/v:fp16"), {"first": 0, "last": 0}),
                              ("mixed", dict(codec="fp16", layer_codecs={1: "tq4"}),
                               {"first": 0, "last": 4}),
                              ("off", dict(codec="tq3", exact_tokens=(0, 0)),
                               {"first": 0, "last": 0})):
        tqkv.checkpoint(store, key, k, v, **kwargs)
        assert store.inspect(key)["exact_tokens"] == want, key
    rk, _ = tqkv.restore(store, "tq3")
    assert np.array_equal(rk[:, -4:], k[:, -4:]) and not np.array_equal(rk[:, -8:-4], k[:, -8:-4])


def test_layer_codecs_and_exact_tokens(store):
    k, v = session_arrays(layers=3, tokens=64, dtype=np.float16)
    tqkv.checkpoint(store, "s", k, v, codec="tq2", layer_codecs={0: "tq4"}, exact_tokens=(4, 8))
    d = store.inspect("s")
    assert d["codecs"][d["layer_codec"][0]] == "tq4"
    assert d["codecs"][d["layer_codec"][1]] == "tq2"
    assert d["exact_tokens"] == {"first": 4, "last": 8}
    rk, _ = tqkv.restore(store, "s")
    assert np.array_equal(rk[:, :4], k[:, :4]) and np.array_equal(rk[:, -8:], k[:, -8:])
    assert not np.array_equal(rk[:, 10:20], k[:, 10:20])


def test_kv_codecs_decode_like_their_plain_codecs(store):
    # K/V presets: K decodes bit for bit as a tq4 session's K, V as a tq2 session's V (the
    # same codec, seed and key means on the same data).
    k, v = session_arrays(layers=3, tokens=48, dtype=np.float16)
    tqkv.checkpoint(store, "kv", k, v, codec="k4v2", layer_codecs={1: "k:fp16/v:tq2.5"})
    tqkv.checkpoint(store, "k4", k, v, codec="tq4", layer_codecs={1: "fp16"})
    tqkv.checkpoint(store, "v2", k, v, codec="tq2", layer_codecs={1: "tq2.5"})
    d = store.inspect("kv")
    assert d["format_version"] == 6 and d["codec"] == "k4v2"  # 6: the guard's figures
    assert d["layer_codecs"] == ["k4v2", "k:fp16/v:tq2.5", "k4v2"]
    assert d["codecs"][d["layer_codec_v"][1]] == "tq2.5"
    rk, rv = tqkv.restore(store, "kv")
    k4, _ = tqkv.restore(store, "k4")
    _, v2 = tqkv.restore(store, "v2")
    assert np.array_equal(rk, k4) and np.array_equal(rv, v2)
    assert np.array_equal(rk[1], k[1])  # layer 1's keys are raw fp16
    with pytest.raises(ValueError, match="k:SPEC/v:SPEC"):
        tqkv.checkpoint(store, "bad", k, v, codec="k4v2,norm=f16")


def test_store_admin(tmp_path):
    uri = "file://" + str(tmp_path / "kv")
    store = tqkv.open_store(uri)
    assert store.name == "posix" and store.uri.startswith("file://")
    k, v = session_arrays(dtype=np.float16)
    for key in ("a", "b", "team/c"):
        tqkv.checkpoint(uri, key, k, v)  # a URI works wherever a store does
    assert [s["key"] for s in store.ls()] == ["a", "b", "team/c"]
    assert [s["key"] for s in store.ls("team/")] == ["team/c"]
    assert store.exists("a") and not store.exists("zzz")
    assert store.size("a") == store.ls()[0]["size"] > 0
    store.pin("a")
    assert store.ls()[0]["pin_until_ns"] == -1
    report = store.gc(max_bytes=1)
    assert report["pinned_kept"] == ["a"] and report["over_cap_after"]
    assert sorted(s["key"] for s in report["evicted"]) == ["b", "team/c"]
    assert [s["key"] for s in store.ls()] == ["a"]
    store.unpin("a")
    store.rm("a")
    assert store.ls() == []
    with pytest.raises(tqkv.NotFoundError):
        store.rm("a")
    mem = tqkv.open_store("memory://")
    tqkv.checkpoint(mem, "m", k, v)
    assert [s["key"] for s in mem.ls()] == ["m"]
    mem.verify("m")


def test_inspect_is_the_clis_json(store, cli, tmp_path):
    import json

    k, v = session_arrays(dtype=np.float16)
    tqkv.checkpoint(store, "s", k, v, codec="tq3.5")
    path = tmp_path / "kv" / "s.tqkv"
    out = subprocess.run([cli, "inspect", "--json", "--chunks", str(path)], check=True,
                         capture_output=True, text=True).stdout
    assert tqkv.inspect(path, chunks=True) == json.loads(out)
    assert store.inspect("s", chunks=True) == json.loads(out)
    tqkv.verify(path)


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("preset", ["tq3", "tq2.5"])
def test_decode_bit_identical_to_cli_decompress(store, cli, tmp_path, preset, dtype):
    k, v = session_arrays(layers=2, tokens=70, heads=2, dim=128, dtype=np.float16)
    tqkv.checkpoint(store, "s", k, v, codec=preset, exact_tokens=(2, 3))
    out = tmp_path / "s.safetensors"
    subprocess.run([cli, "decompress", str(tmp_path / "kv" / "s.tqkv"), str(out),
                    "--dtype", dtype], check=True, capture_output=True)
    tensors = read_safetensors(out)
    rk, rv = tqkv.restore(store, "s", dtype=dtype)
    for layer in range(2):
        for name, got in (("k", rk), ("v", rv)):
            want = tensors[f"layers.{layer}.{name}"]
            assert got[layer].tobytes() == want.tobytes()


def test_stats_say_how_the_bytes_moved(tmp_path):
    k, v = session_arrays(dtype=np.float16)
    for io in ("buffered", "direct"):
        store = tqkv.open_store(f"file://{tmp_path}/{io}?io={io}")
        tqkv.checkpoint(store, "paths", k, v, codec="tq3", model="toy")
        stats = {}
        tqkv.restore(store, "paths", stats=stats)
        assert stats["bytes_direct"] + stats["bytes_page_cache"] == stats["bytes_read"] > 0
        assert stats["bytes_uring"] <= stats["bytes_direct"]
        if io == "buffered":
            assert stats["bytes_direct"] == 0
        elif stats["bytes_direct"]:  # the filesystem takes O_DIRECT: then for every byte
            assert stats["bytes_page_cache"] == 0


def test_warm_restore_memory_keeps_what_restores_take():
    kept = tqkv.warm_restore_memory(2, read_ahead=4 << 20)
    assert kept >= 2 * (4 << 20)
    with pytest.raises(tqkv.InvalidArgumentError):
        tqkv.warm_restore_memory(3, read_ahead=1 << 30)  # 3 GiB: more than the pool keeps


def test_kl_transform_codec_round_trips_and_mixes_with_others(store):
    # kl:B (docs/codec.md §11) wherever a spec is taken: a session codec, a per-layer codec and
    # one side of a K/V spec; format version 8; restored values closer than tq2's at fewer bytes.
    k, v = session_arrays(layers=3, tokens=256, dtype=np.float16)
    tqkv.checkpoint(store, "kl", k, v, codec="kl:2.5", layer_codecs={1: "k:kl:3/v:fp16"})
    tqkv.checkpoint(store, "tq2", k, v, codec="tq2")
    d = store.inspect("kl")
    assert d["format_version"] == 8 and d["codec"] == "kl:2.5"
    assert d["layer_codecs"] == ["kl:2.5", "k:kl:3/v:fp16", "kl:2.5"]
    rk, rv = tqkv.restore(store, "kl")
    qk, qv = tqkv.restore(store, "tq2")
    assert np.array_equal(rv[1], v[1])  # layer 1's values are raw fp16

    def err(a, b):
        a, b = a.astype(np.float32), b.astype(np.float32)
        return float(((a - b) ** 2).sum() / (b ** 2).sum())

    assert err(rk[0], k[0]) < err(qk[0], k[0]) and err(rv[0], v[0]) < err(qv[0], v[0])
    with pytest.raises(ValueError, match="kl:B"):
        tqkv.checkpoint(store, "bad", k, v, codec="kl:9")

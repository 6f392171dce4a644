"""tqkv.vllm without vLLM: the config, the chunk keys, and the paged_hnd layout the connector uses.
(The connector itself runs in vLLM in tests/vllm.)"""
import subprocess
import sys

import numpy as np
import pytest

import tqkv
from tqkv import vllm as tv


def test_import_does_not_need_vllm():
    code = "import sys, tqkv.vllm; assert 'vllm' not in sys.modules, 'vllm imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_config_passes_only_present_keys():
    c = tv.parse_config({"store": "/tmp/kv"}, 128)
    assert c["save_kwargs"] == {}  # the library's defaults apply
    assert c["chunk_tokens"] == 256 and c["namespace"] == "default" and not c["read_only"]
    c = tv.parse_config({"store": "memory://", "codec": "tq3", "exact_tokens": [4, 0],
                         "chunk_tokens": 256, "read_only": True, "namespace": "team-a"}, 128)
    assert c["save_kwargs"] == {"codec": "tq3", "exact_head": 4}
    assert c["chunk_tokens"] == 256 and c["read_only"] and c["namespace"] == "team-a"


@pytest.mark.parametrize("extra, msg", [
    ({}, "needs 'store'"),
    ({"store": "/tmp/kv", "chunk_tokens": 100}, "multiple of the block size"),
    ({"store": "/tmp/kv", "exact_tokens": [0, 4]}, "no\\s+chunk stores an exact tail|must be 0"),
    ({"store": "/tmp/kv", "namespace": "a/b"}, "namespace"),
    ({"store": "/tmp/kv", "codek": "tq3"}, "unknown"),
    # the emulated link is a store now (throttle://, development builds): no connector key
    ({"store": "/tmp/kv", "link_gbps": 0.05}, "unknown .*link_gbps"),
])
def test_config_errors(extra, msg):
    with pytest.raises(ValueError, match=msg):
        tv.parse_config(extra, 128)


def test_chunk_hashes_chain():
    toks = list(range(1000))
    h = tv.chunk_hashes("ns", "model-a", toks, 128)
    assert len(h) == 1000 // 128
    # a prompt extending another shares its chunks; a change in chunk 2 changes chunk 2 and later
    assert tv.chunk_hashes("ns", "model-a", toks[:300], 128) == h[:2]
    edited = toks[:]
    edited[300] = -1
    e = tv.chunk_hashes("ns", "model-a", edited, 128)
    assert e[:2] == h[:2] and all(x != y for x, y in zip(e[2:], h[2:]))
    # another model or namespace never shares a chunk
    assert set(tv.chunk_hashes("ns", "model-b", toks, 128)).isdisjoint(h)
    assert set(tv.chunk_hashes("other", "model-a", toks, 128)).isdisjoint(h)
    assert tv.chunk_key("ns", h[0]).startswith("vllm/ns/")


def test_paged_hnd_round_trip_in_place(tmp_path):
    # vLLM's CPU layout: [blocks, kv_heads, block_size, 2 * head_dim] with K and V in the last axis
    rng = np.random.default_rng(1)
    blocks, heads, bs, d = 9, 3, 16, 64
    kv = rng.standard_normal((blocks, heads, bs, 2 * d)).astype(np.float16)
    ids = [6, 1, 4]
    tqkv.checkpoint(tmp_path, "c", [kv[..., :d]], [kv[..., d:]], layout="paged_hnd",
                    block_ids=ids, codec="fp16")
    out = np.zeros_like(kv)
    st = {}
    tqkv.restore(tmp_path, "c", out=([out[..., :d]], [out[..., d:]]), layout="paged_hnd",
                 block_ids=[0, 2, 8], stats=st)
    assert not st["staged"]
    for src, dst in zip(ids, [0, 2, 8]):
        np.testing.assert_array_equal(out[dst], kv[src])
    assert not out[[1, 3, 4, 5, 6, 7]].any()  # other blocks untouched


def test_chunk_model_string_fits_the_header():
    ident = "/very/long/" + "x" * 400 + "@main cfg=0123 L=30 H=3 D=64 bfloat16 tp=1"
    m = tv.chunk_model(ident, "ab" * 20)
    assert len(m.encode()) <= 256 and m.endswith("chunk=" + "ab" * 20)
    assert m != tv.chunk_model(ident.replace("L=30", "L=31"), "ab" * 20)


def test_config_async_save():
    c = tv.parse_config({"store": "/tmp/kv"}, 128)
    assert c["async_save"] is True and c["save_queue"] == 64
    c = tv.parse_config({"store": "/tmp/kv", "async_save": False, "save_queue": 3}, 128)
    assert c["async_save"] is False and c["save_queue"] == 3
    for bad in ({"async_save": "yes"}, {"save_queue": 0}, {"save_queue": 2.5},
                {"save_queue": True}):
        with pytest.raises(ValueError, match="async_save|save_queue"):
            tv.parse_config({"store": "/tmp/kv", **bad}, 128)


@pytest.mark.parametrize("block, chunk", [(16, 256), (32, 256), (128, 256), (96, 288),
                                          (512, 512)])
def test_default_chunk_is_256_tokens_rounded_up_to_the_block(block, chunk):
    assert tv.default_chunk_tokens(block) == chunk
    assert tv.parse_config({"store": "/tmp/kv"}, block)["chunk_tokens"] == chunk


def test_package_layout_has_no_import_cycle():
    # each module imports on its own in a fresh interpreter (a cycle fails one of them)
    for mod in ("config", "keys", "writer", "worker", "scheduler", "offload_layout"):
        code = f"import tqkv.vllm.{mod}, sys; assert 'vllm' not in sys.modules"
        subprocess.run([sys.executable, "-c", code], check=True)


def test_the_transform_codec_is_a_codec_like_any_other():
    s = tv.parse_config({"store": "/tmp/s", "codec": "kl:2.5"}, 16)
    assert s["save_kwargs"]["codec"] == "kl:2.5"

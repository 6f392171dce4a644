"""Every failure of a public call is a tqkv.Error subclass (issue 34, defect 9): one bad value for
every argument of every public function and method, whatever layer notices it (Python, nanobind's
conversions, the library). Extents past 32 bits are refused, never truncated; gc and pin refuse
the durations the CLI refuses."""
import math
import os

import numpy as np
import pytest

import tqkv
from conftest import session_arrays


@pytest.fixture
def saved(store):
    k, v = session_arrays(layers=2, tokens=24, heads=2, dim=64, dtype=np.float16)
    tqkv.checkpoint(store, "s", k, v)
    return store, k, v


def _bad_calls(store, k, v, tmp_path):
    """(label, thunk) for one bad value of each argument."""
    ro = np.zeros(k.shape, np.float16)
    ro.flags.writeable = False
    codec = tqkv.Codec("tq2.5", 64)
    x = np.ones((4, 64), np.float32)
    codes = codec.encode(x, meta=codec.select_meta(x))
    cp = tqkv.checkpoint
    rs = tqkv.restore
    return [
        # checkpoint(store, key, k, v, *, codec, layer_codecs, exact_tokens, key_means, layout,
        #            block_ids, tokens, model, token_block)
        ("checkpoint store", lambda: cp(42, "s", k, v)),
        ("checkpoint key", lambda: cp(store, 7, k, v)),
        ("checkpoint key ..", lambda: cp(store, "../x", k, v)),
        ("checkpoint k", lambda: cp(store, "s", "not an array", v)),
        ("checkpoint v", lambda: cp(store, "s", k, None)),
        ("checkpoint v layers", lambda: cp(store, "s", k, v[:1])),
        ("checkpoint dtype", lambda: cp(store, "s", k.astype(np.int32), v.astype(np.int32))),
        ("checkpoint codec", lambda: cp(store, "s", k, v, codec="tq9")),
        ("checkpoint codec type", lambda: cp(store, "s", k, v, codec=3)),
        ("checkpoint layer_codecs", lambda: cp(store, "s", k, v, layer_codecs={0: "nope"})),
        ("checkpoint layer_codecs type", lambda: cp(store, "s", k, v, layer_codecs=[1, 2])),
        ("checkpoint exact_tokens -1", lambda: cp(store, "s", k, v, exact_tokens=(-1, 0))),
        ("checkpoint exact_tokens 2**40", lambda: cp(store, "s", k, v, exact_tokens=(0, 2**40))),
        ("checkpoint exact_tokens short", lambda: cp(store, "s", k, v, exact_tokens=(1,))),
        ("checkpoint key_means", lambda: cp(store, "s", k, v, key_means="sometimes")),
        ("checkpoint key_means type", lambda: cp(store, "s", k, v, key_means=12.5)),
        ("checkpoint layout", lambda: cp(store, "s", k, v, layout="xyz")),
        ("checkpoint block_ids", lambda: cp(store, "s", k, v, block_ids="abc")),
        ("checkpoint tokens", lambda: cp(store, "s", k, v, tokens=-3)),
        ("checkpoint model", lambda: cp(store, "s", k, v, model=b"\xff" * 300)),
        ("checkpoint token_block", lambda: cp(store, "s", k, v, token_block=-1)),
        ("checkpoint unknown keyword", lambda: cp(store, "s", k, v, nonsense=1)),
        # restore(store, key, *, out, dtype, layout, block_ids, tokens, on_layer, array, device,
        #         drop_cache, stats)
        ("restore store", lambda: rs(None, "s")),
        ("restore key", lambda: rs(store, 3)),
        ("restore out read-only", lambda: rs(store, "s", out=(ro, ro))),
        ("restore out not a pair", lambda: rs(store, "s", out=ro)),
        ("restore out shape", lambda: rs(store, "s", out=(ro[:1].copy(), ro[:1].copy()))),
        ("restore dtype", lambda: rs(store, "s", dtype="int8")),
        ("restore layout", lambda: rs(store, "s", layout="sideways")),
        ("restore block_ids", lambda: rs(store, "s", block_ids=[[1]])),
        ("restore tokens", lambda: rs(store, "s", out=(k.copy(), v.copy()), tokens=-1)),
        ("restore on_layer", lambda: rs(store, "s", on_layer=5)),
        ("restore array", lambda: rs(store, "s", array="matrix")),
        ("restore stats", lambda: rs(store, "s", stats=[])),
        ("restore_layers on_layer", lambda: list(tqkv.restore_layers(store, "s", on_layer=1))),
        ("restore_layers dtype", lambda: list(tqkv.restore_layers(store, "s", dtype="int8"))),
        # Store methods
        ("open_store uri", lambda: tqkv.open_store(5)),
        ("open_store query", lambda: tqkv.open_store("file:///tmp/x?nonsense=1")),
        ("open_store create", lambda: tqkv.open_store(str(tmp_path / "nope"), create=False)),
        ("ls prefix", lambda: store.ls(prefix=5)),
        ("exists key", lambda: store.exists(None)),
        ("size key", lambda: store.size("nope")),
        ("rm key", lambda: store.rm("nope")),
        ("pin key", lambda: store.pin("nope")),
        ("pin ttl inf", lambda: store.pin("s", ttl=math.inf)),
        ("pin ttl nan", lambda: store.pin("s", ttl=math.nan)),
        ("pin ttl -10", lambda: store.pin("s", ttl=-10)),
        ("pin ttl str", lambda: store.pin("s", ttl="1h")),
        ("unpin key", lambda: store.unpin(5)),
        ("gc max_bytes -1", lambda: store.gc(max_bytes=-1)),
        ("gc max_bytes 2**64", lambda: store.gc(max_bytes=2**64)),
        ("gc max_bytes float", lambda: store.gc(max_bytes=1.5)),
        ("gc ttl -1", lambda: store.gc(ttl=-1)),
        ("gc ttl inf", lambda: store.gc(ttl=math.inf)),
        ("gc temp_age -5", lambda: store.gc(temp_age=-5)),
        ("gc temp_age nan", lambda: store.gc(temp_age=math.nan)),
        ("inspect key", lambda: store.inspect("nope")),
        ("verify key", lambda: store.verify("nope")),
        ("header key", lambda: store.header(3)),
        ("Store.checkpoint", lambda: store.checkpoint("s", k, v, codec="tq9")),
        ("Store.restore", lambda: store.restore("s", dtype="int8")),
        ("Store.restore_layers", lambda: list(store.restore_layers("s", dtype="int8"))),
        ("inspect path", lambda: tqkv.inspect(str(tmp_path / "s.txt"))),
        ("inspect path type", lambda: tqkv.inspect(5)),
        ("verify path", lambda: tqkv.verify(str(tmp_path / "missing.tqkv"))),
        # Module functions
        ("set_num_threads -1", lambda: tqkv.set_num_threads(-1)),
        ("set_num_threads 2**20", lambda: tqkv.set_num_threads(2**20)),
        ("set_num_threads str", lambda: tqkv.set_num_threads("4")),
        ("warm_restore_memory -1", lambda: tqkv.warm_restore_memory(-1)),
        ("warm_restore_memory read_ahead", lambda: tqkv.warm_restore_memory(1, 2**62)),
        # Codec(spec, head_dim) and its methods
        ("Codec spec", lambda: tqkv.Codec("tq9", 64)),
        ("Codec spec type", lambda: tqkv.Codec(None, 64)),
        ("Codec head_dim -1", lambda: tqkv.Codec("tq3", -1)),
        ("Codec head_dim 0", lambda: tqkv.Codec("tq3", 0)),
        ("bits_per_value_for", lambda: codec.bits_per_value_for(-1)),
        ("select_meta x", lambda: codec.select_meta(np.ones((4, 32), np.float32))),
        ("encode x", lambda: codec.encode(np.ones((4, 32), np.float32))),
        ("encode meta", lambda: codec.encode(x, meta=np.zeros(3, np.uint8))),
        ("encode out", lambda: codec.encode(x, meta=codec.select_meta(x),
                                            out=np.zeros((4, 3), np.uint8))),
        ("decode codes", lambda: codec.decode(np.zeros((4, 3), np.uint8),
                                              meta=codec.select_meta(x))),
        ("decode meta", lambda: codec.decode(codes, meta="x")),
        ("decode out", lambda: codec.decode(codes, meta=codec.select_meta(x),
                                            out=np.zeros((4, 64), np.int16))),
        ("decode dtype", lambda: codec.decode(codes, meta=codec.select_meta(x), dtype="int8")),
    ]


def test_every_bad_argument_raises_a_tqkv_error(saved, tmp_path):
    store, k, v = saved
    (tmp_path / "s.txt").write_text("not a session")
    escaped = []
    for label, call in _bad_calls(store, k, v, tmp_path):
        try:
            call()
        except tqkv.Error:
            continue
        except BaseException as e:  # noqa: B036 - anything else is the defect
            escaped.append(f"{label}: {type(e).__name__}: {e}")
            continue
        escaped.append(f"{label}: no error")
    assert not escaped, "\n".join(escaped)
    tqkv.set_num_threads(0)
    # The session is untouched by all of it.
    k2, v2 = tqkv.restore(store, "s")
    assert k2.shape == k.shape


def test_argument_errors_keep_their_python_type_as_cause(store):
    with pytest.raises(tqkv.InvalidArgumentError) as err:
        tqkv.set_num_threads(-1)
    assert isinstance(err.value, ValueError)
    assert isinstance(err.value.__cause__, (TypeError, OverflowError, ValueError))


def test_extents_past_32_bits_are_refused_not_truncated(store):
    # One layer of (4 tokens, 2**32 + 1 KV heads, 64) from a broadcast: no memory behind it.
    big = np.broadcast_to(np.zeros((1, 1, 64), np.float16), (4, 2**32 + 1, 64))
    with pytest.raises(tqkv.InvalidArgumentError, match="exceeds 2"):
        tqkv.checkpoint(store, "big", [big], [big])
    big_dim = np.broadcast_to(np.zeros((1, 1, 1), np.float16), (4, 1, 2**32 + 64))
    with pytest.raises(tqkv.InvalidArgumentError):
        tqkv.checkpoint(store, "big", [big_dim], [big_dim])
    assert not store.exists("big")


def test_gc_and_pin_refuse_what_the_cli_refuses(saved, tmp_path):
    store, _, _ = saved
    # A live writer's temp (fresh mtime): gc(temp_age=-5) used to sweep it.
    temp = tmp_path / "kv" / ".w.tqkv.tmp.1234.0123456789abcdef"
    temp.write_bytes(b"x" * 100)
    with pytest.raises(tqkv.InvalidArgumentError, match="temp_age"):
        store.gc(temp_age=-5)
    assert temp.exists()
    with pytest.raises(tqkv.InvalidArgumentError, match="ttl"):
        store.pin("s", ttl=-10)
    assert store.ls()[0]["pin_until_ns"] == 0
    store.pin("s", ttl=60)
    assert store.ls()[0]["pin_until_ns"] > 0
    report = store.gc(temp_age=0, dry_run=True)
    assert report is not None
    assert os.path.exists(str(tmp_path / "kv" / "s.tqkv"))

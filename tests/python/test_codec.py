"""tqkv.Codec: every preset through float16, bfloat16 (ml_dtypes and raw uint16) and float32,
the same codes as the C++ library, zero copy of inputs and outputs, argument errors."""
import numpy as np
import pytest

import tqkv
from conftest import session_arrays

PRESETS = ["fp16", "tq2", "tq2.5", "tq3", "tq3.5", "tq4"]
# Lowest cosine similarity of decoded to original vectors each preset must reach on Gaussian
# data (docs/codec.md measures about 0.94 / 0.96 / 0.98 / 0.985 / 0.995 for tq2 ... tq4).
MIN_COSINE = {"fp16": 0.99999, "tq2": 0.90, "tq2.5": 0.92, "tq3": 0.95, "tq3.5": 0.96,
              "tq4": 0.98}


def _cosine(a, b):
    a = np.asarray(a, dtype=np.float32).reshape(-1, a.shape[-1])
    b = np.asarray(b, dtype=np.float32).reshape(-1, b.shape[-1])
    num = (a * b).sum(1)
    return float(np.min(num / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))))


def _bf16_from_f32(x):
    """float32 -> bfloat16 bit patterns, round to nearest even (as the library does)."""
    bits = x.astype(np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def _inputs(dtype):
    x = np.random.default_rng(1).standard_normal((3, 100, 128), dtype=np.float32)
    if dtype == "float32":
        return x, x
    if dtype == "float16":
        h = x.astype(np.float16)
        return h, h.astype(np.float32)
    raw = _bf16_from_f32(x)
    ref = (raw.astype(np.uint32) << 16).view(np.float32)
    if dtype == "bfloat16-raw":
        return raw, ref
    ml_dtypes = pytest.importorskip("ml_dtypes")
    return raw.view(ml_dtypes.bfloat16), ref


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "bfloat16-raw", "float32"])
@pytest.mark.parametrize("preset", PRESETS)
def test_round_trip_every_preset(preset, dtype):
    x, ref = _inputs(dtype)
    c = tqkv.Codec(preset, head_dim=128)
    meta = c.select_meta(x) if c.split else None
    codes = c.encode(x, meta=meta)
    assert codes.dtype == np.uint8 and codes.shape == (3, 100, c.code_bytes)
    y = c.decode(codes, meta=meta, dtype="float32")
    assert y.shape == x.shape and y.dtype == np.float32
    assert _cosine(ref, y) >= MIN_COSINE[preset]
    # Decoding into each element type gives the float32 result rounded once.
    y16 = c.decode(codes, meta=meta, dtype="float16")
    assert np.array_equal(y16, y.astype(np.float16))
    if preset == "fp16" and dtype == "float16":
        assert np.array_equal(y16, x)  # raw codes are the values themselves


def test_properties():
    c = tqkv.Codec("tq3", head_dim=128)
    assert c.spec == "tq3" and c.head_dim == 128 and not c.split
    assert c.code_bytes == 48 + 4  # 3 bit-planes of 16 bytes + an f32 norm
    assert c.bits_per_value == pytest.approx(8 * 52 / 128)
    assert c.ratio == pytest.approx(16 / c.bits_per_value)
    assert tqkv.Codec("tq:b=3", head_dim=128).spec == "tq3"  # canonical form
    s = tqkv.Codec("tq2.5", head_dim=128)
    assert s.split and s.meta_bytes == 16
    assert s.bits_per_value_for(100) > s.bits_per_value
    assert "tq3" in repr(c)


@pytest.mark.parametrize("preset", PRESETS)
def test_same_codes_as_the_library(tmp_path, preset):
    """A one-head session checkpointed by the library decodes to exactly what Codec gives for
    the same vectors: the codes (and the split codecs' metadata) are the C++ library's."""
    k, v = session_arrays(layers=1, tokens=300, heads=1, dim=128, dtype=np.float16, seed=2)
    store = tqkv.open_store(str(tmp_path))
    # Plain codes only: no key means, and no exact rows (the default keeps the last 4 tokens).
    tqkv.checkpoint(store, "s", k, v, codec=preset, key_means="off", exact_tokens=(0, 0))
    rk, rv = tqkv.restore(store, "s", dtype="float32")
    c = tqkv.Codec(preset, head_dim=128)
    for src, restored in ((k, rk), (v, rv)):
        x = src[0, :, 0, :]
        meta = c.select_meta(x) if c.split else None
        y = c.decode(c.encode(x, meta=meta), meta=meta, dtype="float32")
        assert np.array_equal(y, restored[0, :, 0, :])


@pytest.mark.parametrize("preset", ["tq3", "tq2.5"])
def test_default_key_means_change_only_the_keys(tmp_path, preset):
    """By default a checkpoint removes the keys' mean per 128 tokens: the values are the plain
    codes' bit for bit, keys with a large shared component come back much closer than plain
    codes bring them, and key_means="off" stores plain codes (the header says which)."""
    k, v = session_arrays(layers=1, tokens=300, heads=1, dim=128, dtype=np.float16, seed=2)
    k = k + np.float16(20.0)  # a shared component, as the K bias of Qwen2.5 gives
    store = tqkv.open_store(str(tmp_path))
    tqkv.checkpoint(store, "c", k, v, codec=preset)
    tqkv.checkpoint(store, "p", k, v, codec=preset, key_means="off")
    assert tqkv._tqkv.header(store._s, "c")["key_mean_block"] == 128
    assert tqkv._tqkv.header(store._s, "p")["key_mean_block"] == 0
    ck, cv = tqkv.restore(store, "c", dtype="float32")
    pk, pv = tqkv.restore(store, "p", dtype="float32")
    assert np.array_equal(cv, pv)
    ref = k.astype(np.float32)
    assert np.abs(ck - ref).mean() < 0.5 * np.abs(pk - ref).mean()
    with pytest.raises(tqkv.InvalidArgumentError, match="key means"):
        tqkv.checkpoint(store, "x", k, v, codec=preset, key_means="sometimes")


def test_out_is_written_in_place_and_inputs_are_views():
    c = tqkv.Codec("tq3", head_dim=64)
    wide = np.random.default_rng(3).standard_normal((50, 96), dtype=np.float32)
    x = wide[:, :64]  # rows 96 elements apart: a view the codec reads as it is
    assert not x.flags.c_contiguous
    codes = np.zeros((50, c.code_bytes), dtype=np.uint8)
    ptr = codes.ctypes.data
    got = c.encode(x, out=codes)
    assert got is codes and codes.ctypes.data == ptr and codes.any()
    assert np.array_equal(codes, c.encode(np.ascontiguousarray(x)))
    out = np.zeros((50, 64), dtype=np.float16)
    assert c.decode(codes, out=out) is out and out.any()
    if tqkv._arrays.BFLOAT16 is not None:
        b = x.astype(tqkv._arrays.BFLOAT16)
        assert np.shares_memory(tqkv._arrays.to_core(b), b)


def test_argument_errors():
    with pytest.raises(tqkv.InvalidArgumentError, match="zz3"):
        tqkv.Codec("zz3", head_dim=128)
    with pytest.raises(tqkv.InvalidArgumentError):
        tqkv.Codec("tq3", head_dim=8)  # TurboQuant needs head_dim >= 16
    c = tqkv.Codec("tq3", head_dim=128)
    with pytest.raises(tqkv.InvalidArgumentError, match="128"):
        c.encode(np.zeros((4, 64), dtype=np.float32))
    with pytest.raises(tqkv.InvalidArgumentError, match="element type"):
        c.encode(np.zeros((4, 128), dtype=np.float64))
    with pytest.raises(tqkv.InvalidArgumentError, match="contiguous"):
        c.encode(np.zeros((4, 256), dtype=np.float32)[:, ::2])
    with pytest.raises(tqkv.InvalidArgumentError):
        c.decode(np.zeros((4, 7), dtype=np.uint8))
    s = tqkv.Codec("tq2.5", head_dim=128)
    with pytest.raises(tqkv.InvalidArgumentError):
        s.encode(np.ones((4, 128), dtype=np.float32))  # a split codec needs meta
    # Errors are both tqkv.Error and the matching builtin.
    assert issubclass(tqkv.InvalidArgumentError, tqkv.Error)
    assert issubclass(tqkv.InvalidArgumentError, ValueError)
    assert issubclass(tqkv.NotFoundError, LookupError)

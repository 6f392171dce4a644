"""One settings resolver for every front end (include/tqkv/settings.h): the same settings given to
the `tqkv` command, to tqkv.checkpoint and to tqkv.llama resolve to the same options, and the
containers they write say the same. Also: the guard's figures reach Python, and strict=True
refuses a breach. The llama.cpp rows use real llama.cpp states from the fuzz corpus (SmolLM2,
head_dim 64), so no llama-cpp-python is needed.
"""
import json
import re
import subprocess

import numpy as np
import pytest

import tqkv
import tqkv.llama

from conftest import REPO, session_arrays

LLAMA_SLOT = REPO / "fuzz" / "corpus" / "llama_state" / "smollm2-fa1.slot"

# (Python keyword arguments, the same settings as `tqkv` flags); None/absent = the default.
ROWS = [
    ({}, []),
    ({"codec": "fp16"}, ["--codec", "fp16"]),
    ({"codec": "k4v2"}, ["--codec", "k4v2"]),
    ({"codec": "tq3", "exact_tokens": (0, 0)}, ["--codec", "tq3", "--exact-tokens", "0,0"]),
    ({"key_means": "off"}, ["--key-means", "off"]),
    ({"codec": "fp16", "layer_codecs": {0: "tq4"}}, ["--codec", "fp16", "--layer-codec", "0:tq4"]),
    ({"codec": "auto:64"}, ["--codec", "auto:64"]),  # tiny sessions: headers dominate
    ({"codec": "auto:64,from=all"}, ["--codec", "auto:64,from=all"]),  # kl:B candidates too
    ({"guard": False}, ["--no-guard"]),
    ({"alignment": 64}, ["--align", "64"]),
    ({"key_means": "session,f32", "exact_tokens": (2, 8)},
     ["--key-means", "session,f32", "--exact-tokens", "2,8"]),
]

# What the library decides by default, written out once here so that a change of a default is
# a visible change of this test.
DEFAULTS = {"codec": "tq3", "layer_codecs": [], "exact_tokens": "0,4", "key_means": "128",
            "strict": False, "guard": True, "alignment": 4096}


def _stored(st, key):
    """The facts of a container that the settings decide."""
    d = st.inspect(key)
    return {"layer_codec": d["layer_codec"], "layer_codec_v": d["layer_codec_v"],
            "exact_tokens": d["exact_tokens"], "key_means": d["key_means"],
            "guard": d["guard"]["recorded"]}


def _cli_json(cli, *args):
    out = subprocess.run([cli, *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    start = re.search(r"^\{", out.stdout, re.M)  # the JSON after the human lines
    assert start, out.stdout
    return json.JSONDecoder().raw_decode(out.stdout[start.start():])[0]


def test_the_defaults_written_out():
    assert tqkv.resolve_settings() == DEFAULTS
    raw = tqkv.resolve_settings(codec="fp16")
    assert raw["exact_tokens"] == "0,0"  # nothing lossy: no exact rows
    assert tqkv.resolve_settings(codec="fp16", layer_codecs={3: "k4v2"})["exact_tokens"] == "0,4"


@pytest.mark.parametrize("kwargs,flags", ROWS, ids=[" ".join(f) or "defaults" for _, f in ROWS])
def test_every_front_end_resolves_the_same(cli, tmp_path, kwargs, flags):
    want = tqkv.resolve_settings(**kwargs)
    st = tqkv.open_store(str(tmp_path / "kv"))
    layers, tokens, heads, dim = 2, 40, 2, 64
    # The command line.
    got_cli = _cli_json(cli, "checkpoint", "--layers", str(layers), "--kv-heads", str(heads),
                        "--head-dim", str(dim), "--tokens", str(tokens), "--store", st.uri,
                        "--session", "cli", "--json", "-", *flags)
    assert got_cli["settings"] == want
    # Python, same geometry and length.
    k, v = session_arrays(layers=layers, tokens=tokens, heads=heads, dim=dim, dtype=np.float16)
    got_py = tqkv.checkpoint(st, "py", k, v, **kwargs)
    assert got_py["settings"] == want
    if "auto" in kwargs.get("codec", ""):
        return  # the allocator's choice depends on the data; the 2-token blob fits no budget
    assert _stored(st, "py") == _stored(st, "cli")
    # llama.cpp, through the package and through `tqkv llama import`.
    tokens_, state = tqkv.llama.split_slot_file(LLAMA_SLOT.read_bytes())
    got_llama = tqkv.llama.save_blob(state, st, "llama-py", 64, tokens_, **kwargs)
    assert got_llama["settings"] == want
    got_llama_cli = _cli_json(cli, "llama", "import", str(LLAMA_SLOT), "--head-dim", "64",
                              "--store", st.uri, "--session", "llama-cli", "--json", *flags)
    assert got_llama_cli["settings"] == want
    assert _stored(st, "llama-py") == _stored(st, "llama-cli")


def test_llama_save_and_load_in_process_round_trip(tmp_path):
    data = LLAMA_SLOT.read_bytes()
    tokens, state = tqkv.llama.split_slot_file(data)
    assert tokens and tqkv.llama.join_slot_file(tokens, state) == data
    st = tqkv.open_store(str(tmp_path / "kv"))
    tqkv.llama.save_blob(state, st, "fp16", 64, tokens, codec="fp16")
    blob, got_tokens = tqkv.llama.load_blob_and_tokens(st, "fp16")
    assert blob == state and got_tokens == tokens  # fp16: byte for byte
    blob_only, _ = tqkv.llama.split_slot_file(state)
    assert blob_only is None  # a bare blob has no tokens
    with pytest.raises(tqkv.CorruptionError):
        tqkv.llama.save_blob(state[:-3], st, "torn", 64)
    assert not st.exists("torn")
    with pytest.raises(tqkv.NotFoundError):
        tqkv.llama.load_blob(st, "missing")


def test_guard_figures_and_strict(store):
    rng = np.random.default_rng(3)
    k, v = session_arrays(layers=2, tokens=64, heads=2, dim=64)
    # Layer 1's keys: one huge shared direction plus a tiny varying part, so 2-bit codes without
    # key means lose the varying part entirely (the guard's case).
    k[1] = 1000.0 + 0.01 * rng.standard_normal(k[1].shape).astype(np.float32)
    st = tqkv.checkpoint(store, "warn", k, v, codec="tq2", key_means="off")
    assert len(st["codec_error"]) == 2 and st["guard_stride"] >= 1
    assert any(layer == 1 and kv == "K" and err > 0.5 for layer, kv, err in st["guard_exceeded"])
    assert st["codec_error"][1][0] > 0.5 > st["codec_error"][0][0]
    with pytest.raises(tqkv.InvalidArgumentError, match="layer 1 K"):
        tqkv.checkpoint(store, "strict", k, v, codec="tq2", key_means="off", strict=True)
    assert not store.exists("strict")
    ok = tqkv.checkpoint(store, "fine", k, v, codec="tq2", strict=True)  # key means fix it
    assert ok["guard_exceeded"] == [] and ok["settings"]["strict"] is True
    unguarded = tqkv.checkpoint(store, "off", k, v, codec="tq2", key_means="off", guard=False)
    assert unguarded["codec_error"] == [] and unguarded["guard_stride"] == 0


@pytest.mark.parametrize("bad", [{"codec": "tq9"}, {"key_means": "sometimes"},
                                 {"exact_tokens": (1,)}, {"exact_tokens": "4,4"},
                                 {"layer_codecs": {0: "auto:3"}}, {"codec": "auto:3,from=x"}])
def test_bad_settings_are_invalid_arguments(store, bad):
    with pytest.raises(tqkv.InvalidArgumentError):
        tqkv.resolve_settings(**bad)

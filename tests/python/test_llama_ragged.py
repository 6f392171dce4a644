"""A llama.cpp sliding-window state past its window (issue 34): the window layers hold only the
window's cells (format version 7). tqkv.llama stores and rebuilds it byte for byte; the array
restores, whose arrays have one token count, refuse it as tqkv.UnsupportedError. The blob is
built here by the layout of docs/llama.md (llama_kv_cache::state_write), no llama-cpp-python.
"""
import struct

import pytest

import tqkv
import tqkv.llama


def cache(positions, layers, n_embd, seed):
    out = bytearray(struct.pack("<II", 1, len(positions)))  # one stream, its cell count
    for p in positions:
        out += struct.pack("<III", p, 1, 0)  # position, one sequence id: 0
    out += struct.pack("<II", 0, layers)  # V not transposed
    for kv in range(2):
        for layer in range(layers):
            rows = bytes((seed + 7 * kv + layer + i) % 61 for i in range(2 * n_embd * len(positions)))
            out += struct.pack("<iQ", 1, 2 * n_embd) + rows  # f16, row size, the rows
    return bytes(out)


def test_window_layers_hold_their_window_and_come_back_byte_for_byte(tmp_path):
    # 2 full-attention layers over 40 tokens, 4 window layers over the last 8.
    blob = cache(list(range(40)), 2, 16, 1) + cache(list(range(32, 40)), 4, 16, 2)
    store = tmp_path / "s"
    st = tqkv.llama.save_blob(blob, str(store), "w", 16, codec="fp16")
    assert st["state_bytes"] == len(blob)
    d = tqkv.inspect(str(store / "w.tqkv"))
    assert d["format_version"] == 7
    assert d["layer_tokens"] == [40, 40, 8, 8, 8, 8]
    assert d["fp16_bytes"] == 2 * (2 * 40 + 4 * 8) * 16 * 2  # the rows held, no padding
    assert tqkv.llama.load_blob(str(store), "w") == blob
    tqkv.verify(str(store / "w.tqkv"))
    with pytest.raises(tqkv.UnsupportedError, match="different counts"):
        tqkv.restore(str(store), "w")
    with pytest.raises(tqkv.UnsupportedError, match="different counts"):
        list(tqkv.restore_layers(str(store), "w"))

"""tqkv.restore_batch / tqkv.checkpoint_batch on numpy block pools: a prompt's chunks saved from
and restored into paged memory in one call each (the library's batch, include/tqkv/batch.h)."""
import threading
import time

import numpy as np
import pytest

import tqkv

LAYERS, HEADS, BLOCK, DIM, CHUNK = 3, 2, 16, 64, 64


def pool(seed=0, blocks=24):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((LAYERS, 2, blocks, BLOCK, HEADS, DIM)).astype(np.float16)


def view(kv):
    """vLLM's CUDA NHD layout [2, blocks, block, heads, dim] per layer, here in host memory."""
    return tqkv.paged_kv([kv[l, 0] for l in range(LAYERS)], [kv[l, 1] for l in range(LAYERS)],
                         layout="paged", tokens=CHUNK)


IDS = [[3, 9, 1, 0], [4, 5, 6, 7], [20, 21, 2, 8]]


@pytest.mark.parametrize("codec", ["fp16", "tq3"])
def test_round_trip_equals_each_chunks_own_restore(tmp_path, codec):
    src = pool(1)
    st = tqkv.checkpoint_batch(tmp_path, ["c0", "c1", "c2"], IDS, view(src), codec=codec,
                               models=["m0", "m1", "m2"], first_tokens=[0, 64, 128],
                               exact_head=4)
    assert st["error"] is None and st["done"] == 3 and st["skipped"] == 0
    assert st["tokens"] == 3 * CHUNK and st["bytes"] > 0
    store = tqkv.open_store(str(tmp_path))
    hdr = [store.header(f"c{i}") for i in range(3)]
    assert [h["model"] for h in hdr] == ["m0", "m1", "m2"]
    assert [h["exact_head"] for h in hdr] == [4, 0, 0]
    assert [h["exact_tail"] for h in hdr] == [0, 0, 0]
    dst = np.zeros((LAYERS, 2, 30, BLOCK, HEADS, DIM), np.float16)
    ready = []
    out_ids = [[29, 28, 27, 26], [0, 1, 2, 3], [10, 12, 14, 16]]
    res = tqkv.restore_batch(tmp_path, ["c0", "c1", "c2"], out_ids, view(dst),
                             models=["m0", "m1", "m2"], on_layer=ready.append)
    assert res["error"] is None and res["done"] == 3 and res["tokens"] == 3 * CHUNK
    assert ready == list(range(LAYERS))
    for i in range(3):
        k, v = tqkv.restore(tmp_path, f"c{i}")  # [layers, tokens, heads, dim]
        got = dst[:, :, out_ids[i]].reshape(LAYERS, 2, CHUNK, HEADS, DIM)
        np.testing.assert_array_equal(got[:, 0], k)
        np.testing.assert_array_equal(got[:, 1], v)
        if codec == "fp16":  # exact: the source's blocks
            want = src[:, :, IDS[i]].reshape(LAYERS, 2, CHUNK, HEADS, DIM)
            np.testing.assert_array_equal(got, want)
    # stored already: skipped
    again = tqkv.checkpoint_batch(tmp_path, ["c0", "c1", "c2"], IDS, view(src), codec=codec)
    assert again["done"] == 3 and again["skipped"] == 3 and again["bytes"] == 0


def test_a_shorter_last_object(tmp_path):
    """A prompt's tail: 2 of a chunk's 4 blocks, saved and restored with tokens=[.., 32]."""
    src = pool(4)
    ids = [IDS[0], IDS[1], [20, 21]]
    st = tqkv.checkpoint_batch(tmp_path, ["c0", "c1", "t"], ids, view(src), codec="fp16",
                               tokens=[0, 0, 2 * BLOCK], skip_existing=False)
    assert st["error"] is None and st["tokens"] == 2 * CHUNK + 2 * BLOCK
    assert tqkv.open_store(str(tmp_path)).header("t")["tokens"] == 2 * BLOCK
    dst = np.zeros((LAYERS, 2, 30, BLOCK, HEADS, DIM), np.float16)
    res = tqkv.restore_batch(tmp_path, ["c0", "t"], [[0, 1, 2, 3], [5, 4]], view(dst),
                             tokens=[0, 2 * BLOCK])
    assert res["error"] is None and res["tokens"] == CHUNK + 2 * BLOCK
    np.testing.assert_array_equal(dst[:, :, [5, 4]], src[:, :, [20, 21]])
    assert not dst[:, :, 6:].any()  # nothing past its two blocks
    # as a whole chunk (4 blocks) it is refused before a byte is written
    dst[:] = 0
    res = tqkv.restore_batch(tmp_path, ["t"], [[5, 4, 6, 7]], view(dst))
    assert res["done"] == 0 and "holds 32 tokens" in res["error"] and not dst.any()
    with pytest.raises(tqkv.InvalidArgumentError, match="tokens"):
        tqkv.restore_batch(tmp_path, ["t"], [[5, 4]], view(dst), tokens=[32, 32])


def test_failure_reports_done_and_leaves_other_model_untouched(tmp_path):
    src = pool(2)
    tqkv.checkpoint_batch(tmp_path, ["a", "b"], IDS[:2], view(src), codec="fp16",
                          models=["m", "m"])
    dst = np.zeros((LAYERS, 2, 30, BLOCK, HEADS, DIM), np.float16)
    res = tqkv.restore_batch(tmp_path, ["a", "b", "a"], IDS, view(dst), models=["m", "x", "m"],
                             in_flight=1)
    assert res["done"] == 1 and "object 2 of 3" in res["error"] and "'m'" in res["error"]
    assert not dst[:, :, IDS[1]].any()  # refused before a byte was written
    res = tqkv.restore_batch(tmp_path, ["a", "nope"], IDS[:2], view(dst))
    assert res["done"] == 1 and "nope" in res["error"]


def test_gil_is_released_and_layer_callback_errors_propagate(tmp_path):
    src = pool(3)
    tqkv.checkpoint_batch(tmp_path, ["a", "b", "c"], IDS, view(src), codec="tq3")
    dst = np.zeros((LAYERS, 2, 30, BLOCK, HEADS, DIM), np.float16)
    ticks = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)
    t = threading.Thread(target=spin)
    t.start()
    tqkv.restore_batch(tmp_path, ["a", "b", "c"], IDS, view(dst),
                       on_layer=lambda l: time.sleep(0.05))
    stop.set()
    t.join()
    assert len(ticks) > 20  # Python ran while the library restored

    def boom(layer):
        raise KeyError("stop at layer %d" % layer)
    with pytest.raises(KeyError, match="stop at layer 0"):
        tqkv.restore_batch(tmp_path, ["a", "b", "c"], IDS, view(dst), on_layer=boom)


def test_bad_arguments_are_clear_errors(tmp_path):
    dst = np.zeros((LAYERS, 2, 30, BLOCK, HEADS, DIM), np.float16)
    with pytest.raises(tqkv.InvalidArgumentError, match="one list per key"):
        tqkv.restore_batch(tmp_path, ["a"], [], view(dst))
    with pytest.raises(tqkv.InvalidArgumentError, match="paged"):
        tqkv.paged_kv([dst[0, 0]], [dst[0, 1]], layout="nhd", tokens=CHUNK)
    res = tqkv.restore_batch(tmp_path, ["a"], [[0, 1, 2, 99]], view(dst))
    assert res["done"] == 0 and res["error"]  # block 99 is outside the pool
    with pytest.raises(tqkv.UnsupportedError, match="not known"):
        tqkv.vllm_cpu_kv([np.zeros((4, HEADS, 32, 2 * DIM), np.float16)], isa="neon",
                         kv_heads=HEADS, head_dim=DIM, tokens=32)

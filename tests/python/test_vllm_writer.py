"""The vLLM connector's background chunk writer (tqkv.vllm.writer) without vLLM: numpy block
pools in a paged layout, a real store whose writes are slowed by the development build's
throttle:// store so that a save takes a known time."""
import logging
import time

import numpy as np
import pytest

import tqkv
from tqkv.vllm import Stats
from tqkv.vllm.writer import ChunkOp, ChunkWriter

LAYERS, HEADS, BLOCK, DIM = 2, 4, 128, 64
CHUNK_BYTES = LAYERS * 2 * HEADS * BLOCK * DIM * 2  # fp16 payload of a one-block chunk
BURST = 64 * 1024  # what the throttle lets pass at once after idle time (store_testing.h)
SAVE = {"codec": "fp16"}


@pytest.fixture
def pool():
    rng = np.random.default_rng(7)
    kv = rng.standard_normal((LAYERS, 12, HEADS, BLOCK, 2 * DIM)).astype(np.float16)
    views = tqkv.paged_kv([kv[l][..., :DIM] for l in range(LAYERS)],
                          [kv[l][..., DIM:] for l in range(LAYERS)], layout="paged_hnd",
                          tokens=BLOCK)
    return kv, views


@pytest.fixture
def slow_store(throttle_uri):
    """A directory store whose writes pass one throttle: about seconds_per_chunk per chunk
    object."""
    def make(path, seconds_per_chunk):
        rate = (CHUNK_BYTES - BURST) / seconds_per_chunk
        return tqkv.open_store(throttle_uri(path, write_rate=rate))
    return make


def op(req, block):
    return ChunkOp(f"c/{req}{block}", f"test {req}{block}", [block], req)


def restored(store, key):
    out = np.zeros((LAYERS, 1, HEADS, BLOCK, 2 * DIM), np.float16)
    tqkv.restore(store, key, out=([out[l][..., :DIM] for l in range(LAYERS)],
                                  [out[l][..., DIM:] for l in range(LAYERS)]),
                 layout="paged_hnd", block_ids=[0], tokens=BLOCK)
    return out[:, 0]


def test_saves_leave_the_caller_and_are_reported_when_done(tmp_path, pool, slow_store):
    kv, views = pool
    store = slow_store(tmp_path, 0.15)
    stats = Stats()
    w = ChunkWriter(store, SAVE, stats, max_queue=8)
    t0 = time.perf_counter()
    w.submit([op("a", 3), op("a", 5), op("b", 7)], views)
    assert time.perf_counter() - t0 < 0.1  # three saves of ~0.15 s each run behind the caller
    # vLLM says a, b and c (never given saves) finished: nothing is done yet
    assert w.finished({"a", "b", "c"}) == set()
    w.wait_for(["a"])
    assert store.exists("c/a3") and store.exists("c/a5")
    assert w.finished(set()) == {"a"}  # a was announced finished before
    w.close()
    assert w.finished(set()) == {"b"}
    assert w.finished({"a", "b", "c"}) == set()  # each reported once; c never
    # each chunk the blocks it was given
    for key, block in (("c/a3", 3), ("c/a5", 5), ("c/b7", 7)):
        np.testing.assert_array_equal(restored(store, key), kv[:, block])
    s = stats.snapshot()
    assert s["chunks_saved"] == 3 and s["errors"] == 0 and s["bytes_written"] > 3 * CHUNK_BYTES


def test_queue_is_bounded(tmp_path, pool, slow_store):
    _, views = pool
    stats = Stats()
    w = ChunkWriter(slow_store(tmp_path, 0.05), SAVE, stats, max_queue=2)
    waited = w.submit([op("r", b) for b in range(6)], views)
    assert w.high_water == 2
    assert waited > 0.05  # the caller waited for room (at least one save)
    s = stats.snapshot()
    assert s["save_waits"] == 1 and s["save_wait_seconds"] == pytest.approx(waited)
    w.close()
    assert stats.snapshot()["chunks_saved"] == 6


def test_gil_is_released_while_saving(tmp_path, pool, slow_store):
    _, views = pool
    w = ChunkWriter(slow_store(tmp_path, 0.6), SAVE, Stats())
    w.submit([op("g", 0)], views)
    # this thread keeps running Python while the writer's save is in the library
    gaps, last, t_end = [], time.perf_counter(), time.perf_counter() + 0.2
    while time.perf_counter() < t_end:
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    assert not tqkv.open_store(str(tmp_path)).exists("c/g0")  # still being written
    assert max(gaps) < 0.1
    w.close()
    assert w.finished({"g"}) == {"g"}


def test_a_failed_save_is_counted_not_raised(tmp_path, pool, caplog):
    _, views = pool
    store = tqkv.open_store(str(tmp_path))
    stats = Stats()
    w = ChunkWriter(store, SAVE, stats)
    bad = ChunkOp("c/bad", "test bad", [99], "e")  # no block 99 in the pool
    with caplog.at_level(logging.WARNING, logger="tqkv.vllm"):
        # e's later chunk counts as failed (a prompt is matched from its start: it could never be
        # found; it may have been published while c/bad was in flight, tqkv/batch.h); g's chunk,
        # another request's, is written
        w.submit([op("e", 0), bad, op("e", 1), op("g", 2)], views)
        w.submit([op("f", 2)], None)  # the KV cache could not be read
        w.close()
    assert store.exists("c/e0") and not store.exists("c/bad")
    assert store.exists("c/g2") and not store.exists("c/f2")
    s = stats.snapshot()
    assert s["errors"] == 3 and s["chunks_saved"] == 2
    assert "saving c/bad failed" in caplog.text and "saving c/f2 failed" in caplog.text
    assert "block id 99" in caplog.text or "outside" in caplog.text
    assert w.finished({"e", "f", "g"}) == {"e", "f", "g"}  # failed saves free their blocks too


def test_stored_chunk_is_not_written_again(tmp_path, pool):
    _, views = pool
    store = tqkv.open_store(str(tmp_path))
    stats = Stats()
    w = ChunkWriter(store, SAVE, stats)
    w.submit([op("s", 4)], views)
    w.wait_for(["s"])
    before = store.ls("c/")[0]["mtime_ns"]
    w.submit([op("s", 4)], views)
    w.close()
    assert store.ls("c/")[0]["mtime_ns"] == before
    assert stats.snapshot()["chunks_saved"] == 1


def test_inline_writer_saves_before_returning(tmp_path, pool):
    _, views = pool
    store = tqkv.open_store(str(tmp_path))
    w = ChunkWriter(store, SAVE, Stats(), threaded=False)
    w.submit([op("i", 0), op("i", 1)], views)
    assert store.exists("c/i0") and store.exists("c/i1")
    assert w.finished({"i"}) == set()  # nothing held back: vLLM frees the blocks itself
    w.close()


def test_close_writes_what_is_queued(tmp_path, pool, slow_store):
    _, views = pool
    store = slow_store(tmp_path, 0.05)
    w = ChunkWriter(store, SAVE, Stats())
    w.submit([op("d", b) for b in range(4)], views)
    n, _ = w.close()
    assert n >= 2  # most were still queued
    assert all(store.exists(f"c/d{b}") for b in range(4))
    # after close, submit writes inline (nothing is left behind a stopped thread)
    w.submit([op("d", 9)], views)
    assert store.exists("c/d9")
    assert not w._thread.is_alive()

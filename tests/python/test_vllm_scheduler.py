"""The vLLM connector's scheduler side (tqkv.vllm.scheduler) without vLLM: what a prompt stores
(full chunks, then its tail up to the last whole block before its last token) and what a later
request finds, driven by stand-ins for vLLM's scheduler output; the objects written and restored
by the connector's own writer and loader over numpy block pools."""
import logging
from types import SimpleNamespace

import numpy as np
import pytest

import tqkv
from tqkv.vllm import Stats
from tqkv.vllm.config import parse_config
from tqkv.vllm.scheduler import Scheduler
from tqkv.vllm.worker import Loader
from tqkv.vllm.writer import ChunkWriter

LAYERS, HEADS, DIM, BLOCK, CHUNK, BLOCKS = 2, 2, 64, 32, 64, 40
GEO = {"layers": LAYERS, "kv_heads": HEADS, "head_dim": DIM}
IDENT = "test-model@ cfg=0 L=2 H=2 D=64 float16 tp=1"
log = logging.getLogger("test")


def pool(seed):
    kv = np.random.default_rng(seed).standard_normal(
        (LAYERS, 2, BLOCKS, BLOCK, HEADS, DIM)).astype(np.float16)
    view = tqkv.paged_kv([kv[l, 0] for l in range(LAYERS)], [kv[l, 1] for l in range(LAYERS)],
                         layout="paged", tokens=CHUNK)
    return kv, view


def step(rid, tokens, block_ids, computed, scheduled):
    """vLLM's SchedulerOutput for one new request, as the scheduler side reads it."""
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=rid, prompt_token_ids=tokens,
                                            block_ids=(block_ids,),
                                            num_computed_tokens=computed)],
        num_scheduled_tokens={rid: scheduled},
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_block_ids=[],
                                              resumed_req_ids=set(), num_computed_tokens=[]),
        preempted_req_ids=[])


@pytest.fixture
def conn(tmp_path):
    store = tqkv.open_store(str(tmp_path))
    cfg = parse_config({"store": str(tmp_path), "chunk_tokens": CHUNK, "codec": "fp16"}, BLOCK)
    sched = Scheduler(store, cfg, IDENT, GEO, BLOCK, Stats(), log, async_save=False)
    writer = ChunkWriter(store, cfg["save_kwargs"], Stats(), threaded=False)
    return SimpleNamespace(store=store, sched=sched, writer=writer)


def save(conn, rid, tokens, kv_view, ids, found=0):
    """A request that finds ``found`` tokens stored (not loaded here) and computes the rest in
    one step: the saves of that step, written."""
    assert conn.sched.matched(rid, tokens, 0) == found
    conn.sched.allocated(rid, 0)  # as if vLLM took none of them
    ops = conn.sched.step(step(rid, tokens, ids, 0, len(tokens)))
    assert not ops.loads
    conn.writer.submit(ops.saves, kv_view)
    return ops.saves


def load(conn, rid, tokens, ids, kv_view):
    """A returning request: the tokens found, its load ops, restored by the loader."""
    found = conn.sched.matched(rid, tokens, 0)
    if not found:
        return 0, []
    ops = conn.sched.step(step(rid, tokens, ids, found, len(tokens) - found))
    ld = Loader(conn.store, Stats(), log)
    ld.start(ops.loads, kv_view)
    assert ld.take_failed() == set()
    return found, ops.loads


def test_a_prompt_stores_what_vllm_would_reuse_and_a_returning_user_finds_it(conn):
    rng = np.random.default_rng(0)
    tokens = [int(t) for t in rng.integers(100, 30000, 180)]  # 2 chunks, then 52 tokens
    src, src_view = pool(1)
    ids = list(range(6))  # blocks 0-5 hold tokens 0-191
    saves = save(conn, "a", tokens, src_view, ids)
    # reusable: every whole block before the last token, (180 - 1) // 32 * 32 = 160 tokens:
    # chunks [0, 64), [64, 128) and a tail of one block [128, 160)
    assert [(o.first_token, o.tokens, o.block_ids) for o in saves] == \
        [(0, 0, [0, 1]), (64, 0, [2, 3]), (128, 32, [4])]
    assert conn.store.header(saves[2].key)["tokens"] == 32

    # the same prompt again, in other blocks: 160 tokens restored, bit for bit (fp16)
    dst, dst_view = pool(2)
    out_ids = [10, 11, 12, 13, 14, 15]
    found, loads = load(conn, "b", tokens, out_ids, dst_view)
    assert found == 160 and [o.tokens for o in loads] == [0, 0, 32]
    np.testing.assert_array_equal(dst[:, :, out_ids[:5]], src[:, :, ids[:5]])
    # a longer prompt (the next turn) finds the same 160; it then stores its own chunk
    # [128, 192) and its own tail, and the old tail stays where it was
    longer = tokens + [int(t) for t in rng.integers(100, 30000, 100)]
    assert conn.sched.matched("c", longer, 0) == 160
    # a prompt that differs inside the tail finds the 2 chunks only
    edited = tokens[:140] + [7] + tokens[141:]
    assert conn.sched.matched("d", edited, 0) == 128
    # one that ends inside the stored tail's block cannot use it (vLLM computes its last
    # token): the chunks only
    assert conn.sched.matched("e", tokens[:150], 0) == 128


def test_the_last_chunk_of_a_whole_chunk_prompt_is_stored_as_a_tail(conn):
    # 192 tokens = 3 chunks, but the last block holds the last token: 160 reusable
    tokens = list(range(1000, 1192))
    _, src_view = pool(3)
    saves = save(conn, "a", tokens, src_view, list(range(6)))
    assert [(o.first_token, o.tokens) for o in saves] == [(0, 0), (64, 0), (128, 32)]
    assert conn.sched.matched("b", tokens, 0) == 160
    # a prompt shorter than a chunk: a tail only, after no chunk
    short = list(range(5000, 5050))
    saves = save(conn, "s", short, src_view, [7, 8])
    assert [(o.first_token, o.tokens, o.block_ids) for o in saves] == [(0, 32, [7])]
    assert conn.sched.matched("t", short, 0) == 32


def test_another_prompts_tail_replaces_it_and_a_bad_one_is_a_miss(conn):
    base = list(range(2000, 2128))  # two chunks
    one, two = base + list(range(1, 60)), base + list(range(500, 559))
    _, src_view = pool(4)
    t1 = save(conn, "a", one, src_view, list(range(6)))[-1]
    assert t1.tokens == 32  # (187 - 1) // 32 * 32 - 128
    t2 = save(conn, "b", two, src_view, list(range(6)), found=128)[-1]
    assert t2.key == t1.key and t2.tokens == 32 and t2.model != t1.model
    assert conn.store.header(t2.key)["model"] == t2.model  # replaced, not skipped
    assert conn.sched.matched("c", two, 0) == 160
    assert conn.sched.matched("d", one, 0) == 128  # its tail is gone: the chunks only
    # a tail whose header lies about its geometry is a miss, counted as an error
    kv = np.zeros((LAYERS, 2, 4, BLOCK, 1, DIM), np.float16)  # one KV head
    view = tqkv.paged_kv([kv[l, 0] for l in range(LAYERS)], [kv[l, 1] for l in range(LAYERS)],
                         layout="paged", tokens=BLOCK)
    st = tqkv.checkpoint_batch(conn.store, [t2.key], [[0]], view, models=[t2.model],
                               codec="fp16", skip_existing=False)
    assert st["done"] == 1 and st["skipped"] == 0
    before = conn.sched._stats.snapshot()["errors"]
    assert conn.sched.matched("e", two, 0) == 128
    assert conn.sched._stats.snapshot()["errors"] == before + 1

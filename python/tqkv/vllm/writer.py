"""The connector's chunk writer: one background thread saves the chunks a step computed, so
saves leave vLLM's forward path (docs/vllm.md, "Save"); each request's queued chunks go to the
library in one tqkv.checkpoint_batch call. Imports no vLLM (tests/python/test_vllm_writer.py
drives it with numpy block pools).

The writer reads vLLM's paged KV tensors in place after wait_for_save returned: the blocks it
reads must stay unchanged until it is done. vLLM guarantees that for a running request's computed
prompt blocks; the connector holds finished requests' blocks (request_finished returns True until
finished() reports the request) and waits for a preempted request's saves (wait_for) before vLLM
reuses its blocks.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Deque, Dict, Iterable, List, Optional, Set, Tuple

from .. import _batch
from .config import CHUNK_ALIGNMENT

logger = logging.getLogger("tqkv.vllm")


@dataclass
class ChunkOp:
    """One chunk to restore or save: its store key, header model string, vLLM block ids, the
    request, the position of its first token in the prompt and its tokens (0: a whole chunk;
    else a prompt's tail, fewer tokens, replacing what its key held)."""
    key: str
    model: str
    block_ids: List[int]
    req_id: str = ""
    first_token: int = 0
    tokens: int = 0


class ChunkWriter:
    """Saves chunks in submission order on one thread (threaded=False: inline, in submit).

    At most ``max_queue`` chunks wait to be written; submit blocks while the queue is full (the
    memory bound: a queued chunk holds vLLM blocks, not a copy). ``kv`` is the library's view of
    vLLM's cache (tqkv.PagedKV), or None when the cache could not be read (the saves count as
    errors). ``save_kwargs`` go to tqkv.checkpoint_batch (codec, key_means, exact_head;
    alignment: CHUNK_ALIGNMENT unless given). A failed
    chunk is logged and counted in ``stats`` (``errors``), never raised, and the request's later
    chunks of the same call are not written (a prompt is matched chunk by chunk from its start,
    so they could never be found)."""

    def __init__(self, store: Any, save_kwargs: Dict[str, Any], stats: Any,
                 max_queue: int = 64, threaded: bool = True, log: Any = logger) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue {max_queue}: at least 1")
        self._store = store
        self._kwargs = {"alignment": CHUNK_ALIGNMENT, **save_kwargs}
        self._stats, self._log, self._max = stats, log, max_queue
        self._cv = threading.Condition()
        self._queue: Deque[Tuple[ChunkOp, Any]] = collections.deque()
        self._pending: Dict[str, int] = {}  # req id -> its chunks queued or being written
        self._saving: Set[str] = set()  # req ids that had saves and were not reported yet
        self._finished: Set[str] = set()  # of those, the ones vLLM said are finished
        self._closing = False
        self.high_water = 0  # the most chunks ever queued at once (tests, logs)
        self._batch = [0, 0, 0, 0.0]  # chunks, tokens, bytes, seconds since last idle
        self._thread: Optional[threading.Thread] = None
        if threaded:
            self._thread = threading.Thread(target=self._run, name="tqkv-vllm-save",
                                            daemon=True)
            self._thread.start()

    @property
    def threaded(self) -> bool:
        return self._thread is not None

    def submit(self, ops: Iterable[ChunkOp], kv: Any) -> float:
        """Queues the saves. Returns the seconds spent waiting for room in the queue."""
        ops = list(ops)
        if not ops:
            return 0.0
        if self._thread is None or self._closing:
            for group in _by_request([(op, kv) for op in ops]):
                self._save(group, kv)
            self._flush_log()
            return 0.0
        waited = 0.0
        with self._cv:
            for op in ops:
                self._saving.add(op.req_id)
                if len(self._queue) >= self._max:
                    t0 = time.perf_counter()
                    self._cv.wait_for(lambda: len(self._queue) < self._max)
                    waited += time.perf_counter() - t0
                self._queue.append((op, kv))
                self._pending[op.req_id] = self._pending.get(op.req_id, 0) + 1
                self.high_water = max(self.high_water, len(self._queue))
                self._cv.notify_all()
        if waited:
            self._stats.add(save_waits=1, save_wait_seconds=waited)
        return waited

    def finished(self, finished_req_ids: Iterable[str]) -> Set[str]:
        """vLLM's get_finished: of the requests with saves that vLLM reported finished (now or
        before), the ones whose saves are all done; each is returned once."""
        with self._cv:
            self._finished |= set(finished_req_ids) & self._saving
            done = {r for r in self._finished if not self._pending.get(r)}
            self._finished -= done
            self._saving -= done
            return done

    def wait_for(self, req_ids: Iterable[str]) -> None:
        """Returns once no chunk of these requests is queued or being written."""
        ids = set(req_ids)
        with self._cv:
            self._cv.wait_for(lambda: not any(self._pending.get(r) for r in ids))

    def close(self) -> Tuple[int, float]:
        """Writes what is queued, then stops the thread. Returns (chunks drained, seconds)."""
        t0 = time.perf_counter()
        with self._cv:
            self._closing = True
            n = len(self._queue)
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
        return n, time.perf_counter() - t0

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue or self._closing)
                if not self._queue:
                    return
                taken = list(self._queue)  # everything queued: one library call per request
                self._queue.clear()
                self._cv.notify_all()  # room for a waiting submit
            for group in _by_request(taken):
                try:
                    self._save(group, group[0][1])
                finally:
                    with self._cv:
                        rid = group[0][0].req_id
                        self._pending[rid] -= len(group)
                        if not self._pending[rid]:
                            del self._pending[rid]
                        self._cv.notify_all()
            with self._cv:
                idle = not self._queue
            if idle:
                self._flush_log()

    def _save(self, group: List[Tuple[ChunkOp, Any]], kv: Any) -> None:
        ops = [op for op, _ in group]
        t0 = time.perf_counter()
        done = skipped = nbytes = tokens = 0
        error = None
        # chunks: one call, those stored already left as they are; a tail (last) replaces what
        # its key held, the tail of another prompt with the same chunks before it
        calls = [ops[:-1], ops[-1:]] if ops[-1].tokens else [ops]
        try:
            if kv is None:
                raise RuntimeError("the KV cache could not be read")
            for part in calls:
                if not part or error is not None:
                    continue
                res = _batch.checkpoint_batch(
                    self._store, [op.key for op in part], [op.block_ids for op in part], kv,
                    models=[op.model for op in part],
                    first_tokens=[op.first_token for op in part],
                    tokens=[op.tokens for op in part], skip_existing=not part[0].tokens,
                    **self._kwargs)
                done, skipped = done + res["done"], skipped + res["skipped"]
                nbytes, tokens, error = nbytes + res["bytes"], tokens + res["tokens"], res["error"]
        except Exception as e:  # noqa: BLE001 - a save that fails is a later miss
            error = str(e)
        if error is not None:
            self._stats.add(errors=len(ops) - done)
            self._log.warning("tqkv connector: saving %s failed (and the %d chunks after it, "
                              "which no lookup reaches without it): %s",
                              ops[done].key, len(ops) - done - 1, error)
        secs = time.perf_counter() - t0
        written = done - skipped
        self._stats.add(chunks_saved=written, bytes_written=nbytes, save_seconds=secs)
        for i, x in enumerate((written, tokens, nbytes, secs)):
            self._batch[i] += x

    def _flush_log(self) -> None:
        n, tokens, nbytes, secs = self._batch
        self._batch = [0, 0, 0, 0.0]
        if n:
            self._log.info("tqkv connector: saved %d chunks (%d tokens, %d bytes) in %.3f s%s",
                           n, tokens, nbytes, secs, " (background)" if self.threaded else "")


def _by_request(items: List[Tuple[ChunkOp, Any]]) -> List[List[Tuple[ChunkOp, Any]]]:
    """Consecutive runs of one request's chunks (with one cache view)."""
    groups: List[List[Tuple[ChunkOp, Any]]] = []
    for item in items:
        if groups and groups[-1][0][0].req_id == item[0].req_id and groups[-1][0][1] is item[1]:
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups

"""The vLLM connector's chunk writer: one background thread saves the chunks a step computed, so
saves leave vLLM's forward path (docs/vllm.md, "Save"). Imports no vLLM
(tests/python/test_vllm_writer.py drives it with numpy block pools).

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

from . import _session

logger = logging.getLogger("tqkv.vllm")


@dataclass
class ChunkOp:
    """One chunk to restore or save: its store key, header model string and vLLM block ids."""
    key: str
    model: str
    block_ids: List[int]
    req_id: str = ""


Views = Tuple[List[Any], List[Any], str]  # per-layer K views, V views, tqkv layout

# The layout of views whose K and V have different strides (vLLM's CPU cache: K channel-major):
# tqkv needs equal strides, so each chunk's blocks are copied (one chunk at a time) into
# contiguous paged_hnd arrays first.
STAGED = "paged_hnd+stage"


def gather(layers: List[Any], block_ids: List[int]) -> List[Any]:
    """Contiguous copies of the blocks ``block_ids`` of each layer (numpy or torch)."""
    out = []
    for x in layers:
        y = x[list(block_ids)]
        out.append(y.contiguous() if hasattr(y, "contiguous") else y.copy())
    return out


class ChunkWriter:
    """Saves chunks in submission order on one thread (threaded=False: inline, in submit).

    At most ``max_queue`` chunks wait to be written; submit blocks while the queue is full (the
    memory bound: a queued chunk holds vLLM blocks, not a copy). The library releases the GIL
    while it encodes and writes. A failed save is logged and counted in ``stats`` (``errors``),
    never raised: the chunk is a later miss."""

    def __init__(self, store: Any, save_kwargs: Dict[str, Any], tokens: int, stats: Any,
                 max_queue: int = 64, threaded: bool = True, log: Any = logger) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue {max_queue}: at least 1")
        self._store, self._kwargs, self._tokens = store, dict(save_kwargs), tokens
        self._stats, self._log, self._max = stats, log, max_queue
        self._cv = threading.Condition()
        self._queue: Deque[Tuple[ChunkOp, Views]] = collections.deque()
        self._pending: Dict[str, int] = {}  # req id -> its chunks queued or being written
        self._saving: Set[str] = set()  # req ids that had saves and were not reported yet
        self._finished: Set[str] = set()  # of those, the ones vLLM said are finished
        self._closing = False
        self.high_water = 0  # the most chunks ever queued at once (tests, logs)
        self._batch = [0, 0, 0.0]  # chunks, bytes, seconds since the writer was last idle
        self._thread: Optional[threading.Thread] = None
        if threaded:
            self._thread = threading.Thread(target=self._run, name="tqkv-vllm-save",
                                            daemon=True)
            self._thread.start()

    @property
    def threaded(self) -> bool:
        return self._thread is not None

    def submit(self, ops: Iterable[ChunkOp], views: Optional[Views]) -> float:
        """Queues the saves (views None: the KV cache could not be read; the saves are counted
        as errors). Returns the seconds spent waiting for room in the queue."""
        ops = list(ops)
        if not ops:
            return 0.0
        if self._thread is None or self._closing:
            for op in ops:
                self._save(op, views)
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
                self._queue.append((op, views))
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
                op, views = self._queue.popleft()
                self._cv.notify_all()  # room for a waiting submit
            try:
                self._save(op, views)
            finally:
                with self._cv:
                    self._pending[op.req_id] -= 1
                    if not self._pending[op.req_id]:
                        del self._pending[op.req_id]
                    idle = not self._queue
                    self._cv.notify_all()
            if idle:
                self._flush_log()

    def _save(self, op: ChunkOp, views: Optional[Views]) -> None:
        t0 = time.perf_counter()
        try:
            if views is None:
                raise RuntimeError("the KV cache could not be read")
            if self._store.exists(op.key):  # another request or server stored it
                return
            ks, vs, layout = views
            ids = op.block_ids
            if layout == STAGED:
                ks, vs, layout = gather(ks, ids), gather(vs, ids), "paged_hnd"
                ids = list(range(len(ids)))
            st = _session.checkpoint(self._store, op.key, ks, vs, layout=layout,
                                     block_ids=ids, tokens=self._tokens,
                                     model=op.model, **self._kwargs)
        except Exception as e:  # noqa: BLE001 - a save that fails is a later miss
            self._stats.add(errors=1)
            self._log.warning("tqkv connector: saving %s failed: %s", op.key, e)
            return
        secs = time.perf_counter() - t0
        nbytes = int(st.get("bytes_written", 0))
        self._stats.add(chunks_saved=1, bytes_written=nbytes, save_seconds=secs)
        self._batch[0] += 1
        self._batch[1] += nbytes
        self._batch[2] += secs

    def _flush_log(self) -> None:
        n, nbytes, secs = self._batch
        self._batch = [0, 0, 0.0]
        if n:
            self._log.info("tqkv connector: saved %d chunks (%d tokens, %d bytes) in %.3f s%s",
                           n, n * self._tokens, nbytes, secs,
                           " (background)" if self.threaded else "")

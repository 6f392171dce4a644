"""The connector's scheduler side, without vLLM's classes: which stored chunks a request can
use (headers only), and each step's lists of chunks to load and to save."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

from .. import _tqkv
from .keys import chunk_hashes, chunk_key, chunk_model
from .writer import ChunkOp


@dataclass
class StepOps:
    loads: List[ChunkOp] = field(default_factory=list)
    saves: List[ChunkOp] = field(default_factory=list)
    flush: List[str] = field(default_factory=list)  # preempted requests with saves in flight


@dataclass
class _Req:
    tokens: List[int]
    hashes: List[str]
    block_ids: List[int] = field(default_factory=list)
    next_save: int = 0  # the first chunk not yet saved or known stored


class Scheduler:
    def __init__(self, store: Any, cfg: Dict[str, Any], ident: str, geo: Dict[str, Any],
                 block: int, stats: Any, log: Any, async_save: bool) -> None:
        self._store, self._cfg, self._ident, self._geo = store, cfg, ident, geo
        self._chunk, self._ns, self._block = cfg["chunk_tokens"], cfg["namespace"], block
        self._stats, self._log, self._async = stats, log, async_save
        self._reqs: Dict[str, _Req] = {}
        self._pending: Dict[str, List[int]] = {}  # req -> chunk indexes to load
        self._saving: set = set()  # requests given save ops (their blocks wait for the writer)

    def _req(self, rid: str, tokens: Any) -> _Req:
        r = self._reqs.get(rid)
        if r is None:
            toks = list(tokens or [])
            r = _Req(toks, chunk_hashes(self._ns, self._ident, toks, self._chunk))
            self._reqs[rid] = r
        return r

    def _chunk_ok(self, h: str) -> bool:
        key = chunk_key(self._ns, h)
        try:
            hd = self._store.header(key)
        except _tqkv.NotFoundError:
            return False
        except _tqkv.Error as e:
            self._stats.add(errors=1)
            self._log.warning("tqkv connector: %s unreadable (a miss): %s", key, e)
            return False
        g = self._geo
        want = (chunk_model(self._ident, h), g["layers"], g["kv_heads"], g["head_dim"],
                self._chunk)
        got = (hd.get("model"), hd.get("layers"), hd.get("kv_heads"), hd.get("head_dim"),
               hd.get("tokens"))
        if got != want:
            self._stats.add(errors=1)
            self._log.warning("tqkv connector: %s holds %s, expected %s (a miss)", key, got, want)
            return False
        return True

    def matched(self, rid: str, tokens: Any, num_computed: int) -> int:
        """get_num_new_matched_tokens: stored tokens beyond num_computed (whole chunks)."""
        r = self._req(rid, tokens)
        # at least one prompt token is left for vLLM to compute (it needs its logits)
        limit = min(len(r.hashes), (len(r.tokens) - 1) // self._chunk)
        first = num_computed // self._chunk
        if num_computed % self._chunk or first >= limit:
            return 0
        n = 0
        t0 = time.perf_counter()
        while n < limit and self._chunk_ok(r.hashes[n]):
            n += 1
        self._stats.add(lookups=1)
        if n <= first:
            self._stats.add(miss_lookups=1)
            return 0
        self._pending[rid] = list(range(first, n))
        r.next_save = max(r.next_save, n)  # those chunks are stored already
        ext = n * self._chunk - num_computed
        self._stats.add(hit_tokens=ext)
        self._log.info("tqkv connector: request %s: %d of %d prompt tokens stored (%d chunks, "
                       "looked up in %.3f s)", rid, n * self._chunk, len(r.tokens), n - first,
                       time.perf_counter() - t0)
        return ext

    def allocated(self, rid: str, num_external_tokens: int) -> None:
        if num_external_tokens == 0:
            self._pending.pop(rid, None)

    def _ops(self, rid: str, r: _Req, chunks: List[int]) -> List[ChunkOp]:
        per = self._chunk // self._block
        ops = []
        for i in chunks:
            ids = r.block_ids[i * per:(i + 1) * per]
            if len(ids) != per:
                break
            ops.append(ChunkOp(chunk_key(self._ns, r.hashes[i]),
                               chunk_model(self._ident, r.hashes[i]), list(ids), rid,
                               i * self._chunk))
        return ops

    def step(self, out: Any) -> StepOps:
        """build_connector_meta: the chunks to load and to save in this step."""
        ops = StepOps()
        done: Dict[str, int] = {}
        for nr in out.scheduled_new_reqs:
            r = self._req(nr.req_id, nr.prompt_token_ids)
            r.block_ids = list(nr.block_ids[0])
            done[nr.req_id] = nr.num_computed_tokens + out.num_scheduled_tokens.get(nr.req_id, 0)
            if nr.req_id in self._pending:
                ops.loads += self._ops(nr.req_id, r, self._pending.pop(nr.req_id))
        cached = out.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            r = self._reqs.get(rid)
            if r is None:
                continue
            new_ids = cached.new_block_ids[i]
            if new_ids is not None:
                if rid in cached.resumed_req_ids:
                    r.block_ids = list(new_ids[0])
                else:
                    r.block_ids += list(new_ids[0])
            done[rid] = cached.num_computed_tokens[i] + out.num_scheduled_tokens.get(rid, 0)
            if rid in self._pending:  # resumed after preemption: its blocks were freed
                ops.loads += self._ops(rid, r, self._pending.pop(rid))
        if not self._cfg["read_only"]:
            for rid, computed in done.items():
                r = self._reqs[rid]
                full = min(computed, len(r.tokens)) // self._chunk
                if full > r.next_save:
                    saves = self._ops(rid, r, list(range(r.next_save, full)))
                    ops.saves += saves
                    r.next_save = full
                    if saves and self._async:
                        self._saving.add(rid)
        # vLLM frees a preempted request's blocks at once: the worker waits for their saves
        # (handle_preemptions) before this step can overwrite them
        ops.flush = [rid for rid in getattr(out, "preempted_req_ids", None) or ()
                     if rid in self._saving]
        return ops

    def finished(self, rid: str) -> Tuple[bool, None]:
        """request_finished: True keeps the blocks until the worker reports the request."""
        self._reqs.pop(rid, None)
        self._pending.pop(rid, None)
        delay = rid in self._saving
        self._saving.discard(rid)
        return delay, None

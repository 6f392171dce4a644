"""The connector's scheduler side, without vLLM's classes: which stored chunks a request can
use (headers only), and each step's lists of chunks to load and to save.

A prompt is stored as the tokens vLLM's own prefix cache would reuse for it, every whole block
before its last token: full chunks, then the rest (fewer tokens than a chunk, a whole number of
blocks) as one shorter last object, the tail (docs/format.md §14)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .. import _tqkv
from .keys import chunk_hashes, chunk_key, chunk_model, tail_hash, tail_key
from .writer import ChunkOp


@dataclass
class StepOps:
    loads: List[ChunkOp] = field(default_factory=list)
    saves: List[ChunkOp] = field(default_factory=list)
    flush: List[str] = field(default_factory=list)  # preempted requests with saves in flight


@dataclass
class _Tail:
    key: str
    model: str
    first: int  # its first token's position in the prompt
    tokens: int


@dataclass
class _Req:
    tokens: List[int]
    hashes: List[str]
    block_ids: List[int] = field(default_factory=list)
    next_save: int = 0  # the first chunk not yet saved or known stored
    tail_saved: bool = False


@dataclass
class _Load:
    chunks: List[int]
    tail: Optional[_Tail] = None


class Scheduler:
    def __init__(self, store: Any, cfg: Dict[str, Any], ident: str, geo: Dict[str, Any],
                 block: int, stats: Any, log: Any, async_save: bool) -> None:
        self._store, self._cfg, self._ident, self._geo = store, cfg, ident, geo
        self._chunk, self._ns, self._block = cfg["chunk_tokens"], cfg["namespace"], block
        self._stats, self._log, self._async = stats, log, async_save
        self._reqs: Dict[str, _Req] = {}
        self._pending: Dict[str, _Load] = {}  # req -> the stored objects to load
        self._saving: set = set()  # requests given save ops (their blocks wait for the writer)

    def _req(self, rid: str, tokens: Any) -> _Req:
        r = self._reqs.get(rid)
        if r is None:
            toks = list(tokens or [])
            r = _Req(toks, chunk_hashes(self._ns, self._ident, toks, self._chunk))
            self._reqs[rid] = r
        return r

    def _header(self, key: str) -> Optional[Dict[str, Any]]:
        try:
            return self._store.header(key)
        except _tqkv.NotFoundError:
            return None
        except _tqkv.Error as e:
            self._stats.add(errors=1)
            self._log.warning("tqkv connector: %s unreadable (a miss): %s", key, e)
            return None

    def _fits(self, key: str, hd: Dict[str, Any], model: str, tokens: int) -> bool:
        """Whether the header holds ``model``, this cache's geometry and ``tokens`` tokens."""
        g = self._geo
        want = (model, g["layers"], g["kv_heads"], g["head_dim"], tokens)
        got = (hd.get("model"), hd.get("layers"), hd.get("kv_heads"), hd.get("head_dim"),
               hd.get("tokens"))
        if got != want:
            self._stats.add(errors=1)
            self._log.warning("tqkv connector: %s holds %s, expected %s (a miss)", key, got, want)
            return False
        return True

    def _chunk_ok(self, h: str) -> bool:
        key = chunk_key(self._ns, h)
        hd = self._header(key)
        return hd is not None and self._fits(key, hd, chunk_model(self._ident, h), self._chunk)

    def _tail_of(self, r: _Req, n: int, tokens: int) -> _Tail:
        """The tail of ``tokens`` of the request's tokens after its first n full chunks."""
        parent = r.hashes[n - 1] if n else ""
        first = n * self._chunk
        return _Tail(tail_key(self._ns, self._ident, parent),
                     chunk_model(self._ident, tail_hash(self._ns, self._ident, parent,
                                                        r.tokens[first:first + tokens])),
                     first, tokens)

    def _tail(self, r: _Req, n: int, end: int) -> Optional[_Tail]:
        """The stored tail after the request's first n full chunks, when it holds the request's
        next tokens and ends at or before ``end``."""
        key = tail_key(self._ns, self._ident, r.hashes[n - 1] if n else "")
        hd = self._header(key)
        stored = int(hd.get("tokens") or 0) if hd is not None else 0
        if not 0 < stored < self._chunk or stored % self._block or \
                n * self._chunk + stored > end:
            return None
        tail = self._tail_of(r, n, stored)
        if hd.get("model") != tail.model:  # the tail of another prompt with these chunks: a miss
            return None
        return tail if self._fits(key, hd, tail.model, stored) else None

    def reusable(self, r: _Req) -> int:
        """Where a request's reusable prefix ends: every whole block before its last token (vLLM
        computes at least that token, for its logits)."""
        return (len(r.tokens) - 1) // self._block * self._block

    def matched(self, rid: str, tokens: Any, num_computed: int) -> int:
        """get_num_new_matched_tokens: stored tokens beyond num_computed (whole chunks, then the
        tail stored after them)."""
        r = self._req(rid, tokens)
        end = self.reusable(r)
        first = num_computed // self._chunk
        if num_computed % self._chunk or num_computed >= end:
            return 0
        t0 = time.perf_counter()
        n = 0
        while (n + 1) * self._chunk <= end and self._chunk_ok(r.hashes[n]):
            n += 1
        tail = self._tail(r, n, end) if n * self._chunk < end else None
        self._stats.add(lookups=1)
        matched = n * self._chunk + (tail.tokens if tail else 0)
        if matched <= num_computed:
            self._stats.add(miss_lookups=1)
            return 0
        self._pending[rid] = _Load(list(range(first, n)), tail)
        r.next_save = max(r.next_save, n)  # those chunks are stored already
        r.tail_saved = matched == end  # nothing left to store
        ext = matched - num_computed
        self._stats.add(hit_tokens=ext)
        self._log.info("tqkv connector: request %s: %d of %d prompt tokens stored (%d chunks%s, "
                       "looked up in %.3f s)", rid, matched, len(r.tokens), n - first,
                       f" and a tail of {tail.tokens}" if tail else "", time.perf_counter() - t0)
        return ext

    def allocated(self, rid: str, num_external_tokens: int) -> None:
        if num_external_tokens == 0:
            self._pending.pop(rid, None)

    def _ops(self, rid: str, r: _Req, chunks: List[int],
             tail: Optional[_Tail] = None) -> List[ChunkOp]:
        """The chunks' (and the tail's) ops, up to the first whose blocks vLLM has not given."""
        per = self._chunk // self._block
        ops = []
        for i in chunks:
            ids = r.block_ids[i * per:(i + 1) * per]
            if len(ids) != per:
                return ops
            ops.append(ChunkOp(chunk_key(self._ns, r.hashes[i]),
                               chunk_model(self._ident, r.hashes[i]), list(ids), rid,
                               i * self._chunk))
        if tail is not None:
            b0 = tail.first // self._block
            ids = r.block_ids[b0:b0 + tail.tokens // self._block]
            if len(ids) == tail.tokens // self._block:
                ops.append(ChunkOp(tail.key, tail.model, list(ids), rid, tail.first,
                                   tail.tokens))
        return ops

    def _tail_save(self, r: _Req) -> Optional[_Tail]:
        """The prompt's tail to store: its tokens after the full chunks, up to reusable()."""
        n, rest = divmod(self.reusable(r), self._chunk)
        return self._tail_of(r, n, rest) if rest else None

    def step(self, out: Any) -> StepOps:
        """build_connector_meta: the chunks to load and to save in this step."""
        ops = StepOps()
        done: Dict[str, int] = {}
        for nr in out.scheduled_new_reqs:
            r = self._req(nr.req_id, nr.prompt_token_ids)
            r.block_ids = list(nr.block_ids[0])
            done[nr.req_id] = nr.num_computed_tokens + out.num_scheduled_tokens.get(nr.req_id, 0)
            if nr.req_id in self._pending:
                ops.loads += self._load_ops(nr.req_id, r)
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
                ops.loads += self._load_ops(rid, r)
        if not self._cfg["read_only"]:
            for rid, computed in done.items():
                r = self._reqs[rid]
                # the full chunks computed, up to reusable(); the tail once that is computed
                end = self.reusable(r)
                done_to = min(computed, end)
                full = done_to // self._chunk
                saves: List[ChunkOp] = []
                if full > r.next_save:
                    saves = self._ops(rid, r, list(range(r.next_save, full)))
                    r.next_save = full
                if done_to == end and not r.tail_saved:
                    tail = self._tail_save(r)
                    if tail is not None:
                        saves += self._ops(rid, r, [], tail)
                    r.tail_saved = True
                ops.saves += saves
                if saves and self._async:
                    self._saving.add(rid)
        # vLLM frees a preempted request's blocks at once: the worker waits for their saves
        # (handle_preemptions) before this step can overwrite them
        ops.flush = [rid for rid in getattr(out, "preempted_req_ids", None) or ()
                     if rid in self._saving]
        return ops

    def _load_ops(self, rid: str, r: _Req) -> List[ChunkOp]:
        load = self._pending.pop(rid)
        ops = self._ops(rid, r, load.chunks, load.tail)
        want = len(load.chunks) + (load.tail is not None)
        if len(ops) < want:  # vLLM allocates a request's external tokens' blocks first
            self._log.warning("tqkv connector: request %s: blocks for %d of %d stored objects",
                              rid, len(ops), want)
        return ops

    def finished(self, rid: str) -> Tuple[bool, None]:
        """request_finished: True keeps the blocks until the worker reports the request."""
        self._reqs.pop(rid, None)
        self._pending.pop(rid, None)
        delay = rid in self._saving
        self._saving.discard(rid)
        return delay, None

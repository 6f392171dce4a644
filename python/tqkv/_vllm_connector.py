"""The vLLM KV connector class (imports vLLM; tqkv.vllm builds it on first use)."""
from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from . import _session, _store, _tqkv
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.logger import init_logger

from ._vllm_cpu_layout import split_cpu_kv
from ._vllm_writer import STAGED, ChunkOp, ChunkWriter, gather
from .vllm import Stats, chunk_hashes, chunk_key, chunk_model, model_identity, parse_config

logger = init_logger("vllm.tqkv")  # vLLM's log format and level

# Chunks restored at once (each stages one chunk's blocks). 2 let one chunk's bytes arrive while
# another decodes; 4 were slower from a cold disk at 16K on 2 vCPUs (docs/lab/vllm.md).
_RESTORE_IN_FLIGHT = 2


def _layer_index(name: str, fallback: int) -> int:
    m = re.search(r"\.(\d+)\.", name)
    return int(m.group(1)) if m else fallback


def _split_kv(kv: Any, head_dim: int, kv_heads: int, block_size: int,
              isa: str = "") -> Tuple[Any, Any, str]:
    """K and V views of one layer of vLLM's paged cache, and their tqkv layout.

    The K/V split is a leading or second axis of 2, or (vLLM 0.32's CPU backend, ``isa`` its
    attention ISA) the 4-D [blocks, H, N, 2 * head_dim] tensor that cpu_attn.py splits in halves
    of N * head_dim per block and head, each ordered as that ISA's kernels write it
    (_vllm_cpu_layout.py); those are staged: copied per chunk."""
    if kv.dim() == 5 and kv.shape[0] == 2:
        k, v = kv[0], kv[1]
    elif kv.dim() == 5 and kv.shape[1] == 2:
        k, v = kv[:, 0], kv[:, 1]
    elif kv.dim() == 4 and kv.shape[-1] == 2 * head_dim:
        k, v = split_cpu_kv(kv, head_dim, kv_heads, block_size, isa)
        return k, v, STAGED
    else:
        raise _tqkv.UnsupportedError(f"vLLM KV cache layer of shape {tuple(kv.shape)} (head_dim "
                                     f"{head_dim}, kv_heads {kv_heads}): layout not understood")
    if k.shape[-1] != head_dim or k.stride(-1) != 1:
        raise _tqkv.UnsupportedError(f"vLLM KV cache layer {tuple(kv.shape)}: channels not "
                                     "contiguous")
    if tuple(k.shape[1:3]) == (kv_heads, block_size):
        return k, v, "paged_hnd"
    if tuple(k.shape[1:3]) == (block_size, kv_heads):
        return k, v, "paged"
    raise _tqkv.UnsupportedError(f"vLLM KV cache layer {tuple(kv.shape)}: no axis pair "
                                 f"({kv_heads} heads, {block_size} tokens)")


@dataclass
class TqkvStats(KVConnectorStats):
    """The connector's counters for vLLM's "KV Transfer metrics" log line (sums per interval)."""

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> "TqkvStats":
        for k, v in other.data.items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> Dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in self.data.items()}

    def is_empty(self) -> bool:
        return not any(self.data.values())


@dataclass
class TqkvMeta(KVConnectorMetadata):
    loads: List[ChunkOp] = field(default_factory=list)
    saves: List[ChunkOp] = field(default_factory=list)
    flush: List[str] = field(default_factory=list)  # preempted requests with saves in flight


@dataclass
class _Req:
    tokens: List[int]
    hashes: List[str]
    block_ids: List[int] = field(default_factory=list)
    next_save: int = 0  # the first chunk not yet saved or known stored


class TqkvConnector(KVConnectorBase_V1):
    """Saves prompt KV to a tqkv store in chained chunks and restores stored prefixes."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        self._block = vllm_config.cache_config.block_size
        self._cfg = parse_config(extra, self._block)
        self._chunk = self._cfg["chunk_tokens"]
        self._ns = self._cfg["namespace"]
        self._ident, self._geo = model_identity(vllm_config)
        self._cache_dtype = vllm_config.cache_config.cache_dtype
        link = self._cfg["link_gbps"]
        # Benchmarks: reads pass one emulated link of link_gbps GB/s per connector (per process).
        self._store = _store.Store(_tqkv.throttled_store(self._cfg["store"], link * 1e9, 0.0,
                                                         False)) if link \
            else _store.open_store(self._cfg["store"])
        self._stats = Stats()
        self._reported: Dict[str, float] = {}
        self._is_scheduler = role == KVConnectorRole.SCHEDULER
        # scheduler side
        self._reqs: Dict[str, _Req] = {}
        self._pending: Dict[str, List[int]] = {}  # req -> chunk indexes to load
        self._async = self._cfg["async_save"] and not self._cfg["read_only"]
        self._saving: set = set()  # requests given save ops (their blocks wait for the writer)
        # worker side
        self._layers: Dict[str, Any] = {}  # layer name -> kv tensor (from the forward)
        self._order: List[str] = []
        self._load_thread: Optional[threading.Thread] = None
        self._cv = threading.Condition()
        self._ready_layers = -1  # all chunks restored up to this layer
        self._failed_blocks: set = set()
        self._kv_views: Optional[Tuple[List[Any], List[Any], str]] = None
        self._writer: Optional[ChunkWriter] = None
        if not self._is_scheduler and not self._cfg["read_only"]:
            self._writer = ChunkWriter(self._store, self._cfg["save_kwargs"], self._chunk,
                                       self._stats, self._cfg["save_queue"],
                                       threaded=self._async, log=logger)
        if getattr(self._kv_transfer_config, "kv_load_failure_policy", "recompute") != \
                "recompute":
            logger.warning("tqkv connector: set kv_load_failure_policy='recompute' so that a "
                           "chunk that fails to restore is recomputed, not a failed request")
        logger.info("tqkv connector (%s): store %s, chunk %d tokens, namespace %s, model %s, "
                    "save options %s%s%s", "scheduler" if self._is_scheduler else "worker",
                    self._store.uri, self._chunk, self._ns, self._ident,
                    self._cfg["save_kwargs"] or "library defaults",
                    ", read-only" if self._cfg["read_only"] else
                    f", saves in the background (queue {self._cfg['save_queue']} chunks)"
                    if self._async else ", saves in the step",
                    f", reads through an emulated {link} GB/s link" if link else "")

    # ---- scheduler side ----
    def _chunk_ok(self, h: str) -> bool:
        key = chunk_key(self._ns, h)
        try:
            hd = self._store.header(key)
        except _tqkv.NotFoundError:
            return False
        except _tqkv.Error as e:
            self._stats.add(errors=1)
            logger.warning("tqkv connector: %s unreadable (a miss): %s", key, e)
            return False
        g = self._geo
        want = (chunk_model(self._ident, h), g["layers"], g["kv_heads"], g["head_dim"],
                self._chunk)
        got = (hd.get("model"), hd.get("layers"), hd.get("kv_heads"), hd.get("head_dim"),
               hd.get("tokens"))
        if got != want:
            self._stats.add(errors=1)
            logger.warning("tqkv connector: %s holds %s, expected %s (a miss)", key, got, want)
            return False
        return True

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int):
        tokens = list(request.prompt_token_ids or [])
        rid = request.request_id
        r = self._reqs.get(rid)
        if r is None:
            r = _Req(tokens, chunk_hashes(self._ns, self._ident, tokens, self._chunk))
            self._reqs[rid] = r
        # at least one prompt token is left for vLLM to compute (it needs its logits)
        limit = min(len(r.hashes), (len(tokens) - 1) // self._chunk)
        first = num_computed_tokens // self._chunk
        if num_computed_tokens % self._chunk or first >= limit:
            return 0, False
        n = 0
        t0 = time.perf_counter()
        while n < limit and self._chunk_ok(r.hashes[n]):
            n += 1
        self._stats.add(lookups=1)
        if n <= first:
            self._stats.add(miss_lookups=1)
            return 0, False
        self._pending[rid] = list(range(first, n))
        r.next_save = max(r.next_save, n)  # those chunks are stored already
        ext = n * self._chunk - num_computed_tokens
        self._stats.add(hit_tokens=ext)
        logger.info("tqkv connector: request %s: %d of %d prompt tokens stored (%d chunks, "
                    "looked up in %.3f s)", rid, n * self._chunk, len(tokens), n - first,
                    time.perf_counter() - t0)
        return ext, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int):
        if num_external_tokens == 0:
            self._pending.pop(request.request_id, None)

    def _ops(self, rid: str, r: _Req, chunks: List[int]) -> List[Any]:
        per = self._chunk // self._block
        ops = []
        for i in chunks:
            ids = r.block_ids[i * per:(i + 1) * per]
            if len(ids) != per:
                break
            ops.append(ChunkOp(chunk_key(self._ns, r.hashes[i]),
                               chunk_model(self._ident, r.hashes[i]), list(ids), rid))
        return ops

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        meta = TqkvMeta()
        done: Dict[str, int] = {}
        for nr in scheduler_output.scheduled_new_reqs:
            r = self._reqs.get(nr.req_id)
            if r is None:
                toks = list(nr.prompt_token_ids or [])
                r = _Req(toks, chunk_hashes(self._ns, self._ident, toks, self._chunk))
                self._reqs[nr.req_id] = r
            r.block_ids = list(nr.block_ids[0])
            done[nr.req_id] = nr.num_computed_tokens + \
                scheduler_output.num_scheduled_tokens.get(nr.req_id, 0)
            if nr.req_id in self._pending:
                meta.loads += self._ops(nr.req_id, r, self._pending.pop(nr.req_id))
        cached = scheduler_output.scheduled_cached_reqs
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
            done[rid] = cached.num_computed_tokens[i] + \
                scheduler_output.num_scheduled_tokens.get(rid, 0)
            if rid in self._pending:  # resumed after preemption: its blocks were freed
                meta.loads += self._ops(rid, r, self._pending.pop(rid))
        if not self._cfg["read_only"]:
            for rid, computed in done.items():
                r = self._reqs[rid]
                full = min(computed, len(r.tokens)) // self._chunk
                if full > r.next_save:
                    ops = self._ops(rid, r, list(range(r.next_save, full)))
                    meta.saves += ops
                    r.next_save = full
                    if ops and self._async:
                        self._saving.add(rid)
        # vLLM frees a preempted request's blocks at once: the worker waits for their saves
        # (handle_preemptions) before this step can overwrite them
        meta.flush = [rid for rid in getattr(scheduler_output, "preempted_req_ids", None) or ()
                      if rid in self._saving]
        return meta

    def request_finished(self, request: Any, block_ids: List[int]):
        rid = request.request_id
        self._reqs.pop(rid, None)
        self._pending.pop(rid, None)
        # True: vLLM keeps the blocks until the worker's get_finished reports the request (its
        # saves written); the worker reports exactly the requests it was given save ops for
        delay = rid in self._saving
        self._saving.discard(rid)
        return delay, None

    # ---- worker side ----
    def _views(self) -> Tuple[List[Any], List[Any], str]:
        if self._kv_views is None:
            names = sorted(self._layers, key=lambda n: _layer_index(n, 0))
            ks, vs, layout = [], [], ""
            isa = ""
            kv0 = self._layers[names[0]]
            if kv0.dim() == 4 and kv0.device.type == "cpu":
                try:  # which kernel wrote the cache decides where K is (vLLM internal)
                    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

                    isa = _get_attn_isa(kv0.dtype, self._block, self._geo["head_dim"],
                                        self._cache_dtype)
                except Exception as e:  # noqa: BLE001 - unknown: refused by _split_kv
                    isa = f"unknown ({e})"
            for name in names:
                k, v, layout = _split_kv(self._layers[name], self._geo["head_dim"],
                                         self._geo["kv_heads"], self._block, isa)
                ks.append(k)
                vs.append(v)
            if len(ks) != self._geo["layers"]:
                raise _tqkv.UnsupportedError(f"{len(ks)} KV cache layers, the model has "
                                             f"{self._geo['layers']}")
            self._order = names
            self._kv_views = (ks, vs, layout)
            kv0 = self._layers[names[0]]
            logger.info("tqkv connector: %d layers of %s %s strides %s -> %s%s", len(ks),
                        tuple(kv0.shape), kv0.dtype, kv0.stride(), layout,
                        f" (CPU attention ISA {isa})" if isa else "")
        return self._kv_views

    def _collect_layers(self, forward_context: Any) -> None:
        if self._layers:
            return
        for name, layer in forward_context.no_compile_layers.items():
            kv = getattr(layer, "kv_cache", None)
            if kv is not None and hasattr(kv, "shape"):
                self._layers[name] = kv

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        self._layers = dict(kv_caches)
        self._kv_views = None

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if not meta.loads:
            return
        self._collect_layers(forward_context)
        with self._cv:
            self._ready_layers = -1
        self._load_thread = threading.Thread(target=self._load, args=(list(meta.loads),),
                                             name="tqkv-vllm-load", daemon=True)
        self._load_thread.start()

    def _restore_chunk(self, op: Any, ks: List[Any], vs: List[Any], layout: str,
                       last: bool) -> int:
        """Restores one chunk into its blocks; returns the bytes read, raises on a failure."""
        # STAGED: the chunk is decoded into contiguous copies of its blocks (one chunk's memory),
        # copied into vLLM's blocks once the restore returned
        out, ids = (ks, vs), op.block_ids
        if layout == STAGED:
            out, ids = (gather(ks, ids), gather(vs, ids)), list(range(len(ids)))

        def on_layer(layer: int, _k: Any, _v: Any) -> None:
            if last and layout != STAGED:
                with self._cv:
                    self._ready_layers = layer
                    self._cv.notify_all()
        st: Dict[str, Any] = {}
        _session.restore(self._store, op.key, out=out,
                         layout="paged_hnd" if layout == STAGED else layout,
                         block_ids=ids, tokens=self._chunk, on_layer=on_layer, stats=st)
        if st.get("model") not in (None, op.model):
            raise _tqkv.CorruptionError(f"{op.key} holds model {st.get('model')!r}")
        if layout == STAGED:
            for layer in range(len(ks)):
                ks[layer][op.block_ids] = out[0][layer]
                vs[layer][op.block_ids] = out[1][layer]
        return int(st.get("bytes_read", 0))

    def _load(self, ops: List[Any]) -> None:
        t0 = time.perf_counter()
        nbytes, loaded, failed = 0, 0, []
        try:
            ks, vs, layout = self._views()
        except Exception as e:  # noqa: BLE001 - any failure is a miss
            logger.warning("tqkv connector: cannot restore into this KV cache: %s", e)
            ops, failed = [], ops

        def one(j: int) -> Any:
            try:
                return self._restore_chunk(ops[j], ks, vs, layout, j == len(ops) - 1)
            except Exception as e:  # noqa: BLE001 - a miss, recomputed by vLLM
                return e
        # Chunks in flight, in order: some chunks' bytes arrive while others decode and copy, so
        # a slow link's transfer alone sets the pace. The last chunk runs after all the others:
        # its on_layer tells vLLM a layer is ready in every chunk.
        results: List[Any] = []
        with ThreadPoolExecutor(max_workers=_RESTORE_IN_FLIGHT,
                                thread_name_prefix="tqkv-vllm-load") as pool:
            futures = [pool.submit(one, j) for j in range(len(ops) - 1)]
            for f in futures:
                results.append(f.result())
                if isinstance(results[-1], Exception):
                    for g in futures:
                        g.cancel()
                    break
        if ops and not any(isinstance(r, Exception) for r in results):
            results.append(one(len(ops) - 1))
        for j, r in enumerate(results):
            if isinstance(r, Exception):
                logger.warning("tqkv connector: restoring %s failed (recomputed): %s",
                               ops[j].key, r)
                failed = ops[j:]
                break
            nbytes += r
            loaded += 1
        for op in failed:
            self._failed_blocks.update(op.block_ids)
        secs = time.perf_counter() - t0
        self._stats.add(chunks_loaded=loaded, bytes_read=nbytes, restore_seconds=secs,
                        load_failures=len(failed))
        logger.info("tqkv connector: restored %d chunks (%d tokens, %d bytes) in %.3f s%s",
                    loaded, loaded * self._chunk, nbytes, secs,
                    f", {len(failed)} failed" if failed else "")
        with self._cv:
            self._ready_layers = 1 << 30
            self._cv.notify_all()

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._load_thread is None:
            return
        idx = self._order.index(layer_name) if layer_name in self._order else 1 << 29
        with self._cv:
            self._cv.wait_for(lambda: self._ready_layers >= idx)

    def _join_load(self) -> None:
        if self._load_thread is not None:
            self._load_thread.join()
            self._load_thread = None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        # The chunks are saved from wait_for_save, once every layer of the step is computed:
        # one tqkv session per chunk holds all layers.
        if layer_name not in self._layers:
            self._layers[layer_name] = kv_layer
            self._kv_views = None

    def wait_for_save(self) -> None:
        self._join_load()
        meta = self._get_connector_metadata()
        if not meta.saves or self._writer is None:
            return
        try:
            views: Optional[Tuple[List[Any], List[Any], str]] = self._views()
        except Exception as e:  # noqa: BLE001
            logger.warning("tqkv connector: cannot save from this KV cache: %s", e)
            views = None
        # async: queued for the writer thread (waits only while save_queue chunks are queued);
        # else written here, in the step
        waited = self._writer.submit(meta.saves, views)
        if waited > 0.05:
            logger.info("tqkv connector: the step waited %.3f s for room in the save queue",
                        waited)

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        flush = getattr(kv_connector_metadata, "flush", None)
        if flush and self._writer is not None:
            t0 = time.perf_counter()
            self._writer.wait_for(flush)
            logger.info("tqkv connector: waited %.3f s for the saves of %d preempted requests",
                        time.perf_counter() - t0, len(flush))

    def get_finished(self, finished_req_ids: set) -> Tuple[Optional[set], Optional[set]]:
        if self._writer is None or not self._writer.threaded:
            return None, None
        return self._writer.finished(finished_req_ids) or None, None

    def get_block_ids_with_load_errors(self) -> set:
        self._join_load()
        out, self._failed_blocks = self._failed_blocks, set()
        return out

    def get_kv_connector_stats(self) -> Optional[TqkvStats]:
        now = self._stats.snapshot()
        delta = {k: v - self._reported.get(k, 0) for k, v in now.items()}
        self._reported = now
        delta = {k: v for k, v in delta.items() if v}
        return TqkvStats(data=delta) if delta else None

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[Dict[str, Any]] = None) -> TqkvStats:
        return TqkvStats(data=dict(data or {}))

    def shutdown(self) -> None:
        self._join_load()
        if self._writer is not None:
            n, secs = self._writer.close()
            if n:
                logger.info("tqkv connector: shutdown wrote the %d queued chunks in %.3f s",
                            n, secs)
        logger.info("tqkv connector stats: %s", self._stats.snapshot())


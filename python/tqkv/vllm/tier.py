"""A tqkv tier for vLLM's own KV offloading: the chunks vLLM's OffloadingConnector cascades from
its CPU primary tier are stored compressed in any tqkv store, and promoted back on a hit.

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 8000000000, "block_size": 256,
        "secondary_tiers": [{"type": "TqkvTier", "module_path": "tqkv.vllm",
                             "store": "/var/kv", "codec": "tq3"}]}}'

One chunk (vLLM's ``block_size`` tokens of every layer, its per-chunk lookups unchanged) is one
tqkv object whose header names the model, geometry, layout, dtype and TP rank (offload_layout);
a lookup reads that header only. Stores and loads run on the library's threads, one batched call
per job (tqkv.checkpoint_batch / tqkv.restore_batch) with the GIL released; a load checks each
object's header before a byte of its primary slot is written. docs/vllm.md, "vLLM's tiers".
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import logging
import queue
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Iterable
from typing import Any, ClassVar, Dict, List, Optional

from vllm.v1.kv_offload.base import (Locality, LookupResult, Medium, OffloadingCounterMetadata,
                                     OffloadKey, ReqContext, RequestOffloadingContext,
                                     ScheduleEndContext)
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

import tqkv

from . import offload_layout as ol
from .config import CHUNK_ALIGNMENT

log = logging.getLogger("tqkv.vllm.tier")

# Counters in vLLM's stats (Prometheus when enabled): what the tier wrote and read, and the
# fp16 bytes those chunks hold, so a dashboard shows the ratio the store gets.
METRICS = {
    "vllm:kv_offload_tqkv_write_bytes": "Bytes the tqkv tier wrote (compressed chunks)",
    "vllm:kv_offload_tqkv_write_kv_bytes": "KV bytes of the chunks the tqkv tier wrote",
    "vllm:kv_offload_tqkv_read_bytes": "Bytes the tqkv tier read (compressed chunks)",
    "vllm:kv_offload_tqkv_store_failures": "Store jobs of the tqkv tier that failed",
    "vllm:kv_offload_tqkv_load_failures": "Chunks the tqkv tier could not load",
}

# Keys known stored by this process (a lookup's fast path); older ones fall back to a header read.
_KNOWN_MAX = 1 << 20


class _Lookups(AsyncLookupManager):
    """vLLM's non-blocking lookups (one batch per scheduler step on its thread); each key's
    answer comes from the tier's header check."""

    def __init__(self, tier: "TqkvTier") -> None:
        super().__init__(tier_type=tier.tier_type)
        self._tier = tier

    def batch_lookup(self, keys: List[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        return [self._tier.present(k) for k in keys]


class TqkvTier(SecondaryTierManager):
    """vLLM SecondaryTierManager storing each offloaded chunk as one compressed tqkv object."""

    medium: ClassVar[Medium] = Medium.STORAGE

    @classmethod
    def build_metric_definitions(cls, extra_config: Dict[str, Any]) -> Dict[str, Any]:
        return {name: OffloadingCounterMetadata(documentation=doc) for name, doc in METRICS.items()}

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                 store: str, codec: Optional[str] = None, key_means: Optional[str] = None,
                 guard: bool = False,
                 namespace: str = "default", kv_heads: Optional[int] = None,
                 head_dim: Optional[int] = None, kv_layout: Optional[str] = None,
                 in_flight: int = 0, pin_s: float = 0, max_bytes: int = 0, ttl_s: float = 0,
                 gc_interval_s: float = 60, locality: Optional[str] = None,
                 backpressure_detector: Any = None) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.locality = Locality(locality) if locality is not None else None
        cfg = offloading_spec.config
        # The scheduler's tier moves whole rows: every TP worker's part is its own object.
        g0 = _geometry(cfg, primary_kv_view, kv_heads, kv_layout, head_dim)
        self._geoms = [dataclasses.replace(g0, rank=r) for r in range(g0.world_size)]
        self.identities = [ol.identity(g, cfg.model.name) for g in self._geoms]
        self.identity = self.identities[0]
        if not namespace or not all(c.isalnum() or c in "._-" for c in namespace) \
                or len(namespace) > 64:
            raise ValueError(f"tqkv tier: namespace {namespace!r}: 1-64 of [A-Za-z0-9._-]")
        digest = hashlib.blake2b(self.identity.encode(), digest_size=8).hexdigest()
        self._prefix = f"vllm-tier/{namespace}/{digest}"
        self._store = tqkv.open_store(str(store))
        if not isinstance(guard, bool):
            raise ValueError(f"tqkv tier: guard {guard!r} is not true or false")
        # No guard by default: measuring each layer's codec error costs as much time as encoding
        # it, on the cascade path that back-pressure watches, and 1 % of a 16-token chunk.
        self._save = {"codec": codec, "key_means": key_means, "alignment": CHUNK_ALIGNMENT,
                      "guard": guard}
        self._in_flight = int(in_flight)
        self._pin_s, self._max_bytes, self._ttl_s = float(pin_s), int(max_bytes), float(ttl_s)
        self._gc_interval, self._last_gc = float(gc_interval_s), time.monotonic()
        self._kvs = []
        for g in self._geoms:
            views = ol.host_kv(primary_kv_view, g)
            self._kvs.append(tqkv.paged_kv(views["k"], views["v"], layout=views["layout"],
                                           tokens=g.chunk_tokens))
        # Loads never wait behind stores: one library call at a time each, in submission order.
        self._loads = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tqkv_tier_load")
        self._stores = concurrent.futures.ThreadPoolExecutor(1,
                                                             thread_name_prefix="tqkv_tier_store")
        self._pending: set = set()
        self._done: "queue.SimpleQueue[tuple]" = queue.SimpleQueue()
        self._known: "OrderedDict[str, None]" = OrderedDict()
        self._lock = threading.Lock()
        self._counters: Dict[str, float] = {}
        self._lookups = _Lookups(self)
        log.info("tqkv tier: %s in %s as %s/..., %d-token chunks", self.identity,
                 self._store.uri, self._prefix, g0.chunk_tokens)

    # -- names and presence ------------------------------------------------------------------
    def object_key(self, key: OffloadKey, rank: int = 0) -> str:
        h = bytes(key).hex()
        return f"{self._prefix}/{h[:2]}/{h}" + (f".r{rank}" if rank else "")

    def present(self, key: OffloadKey) -> bool:
        """True when every worker's object of the chunk is stored under this tier's identity
        (headers read unless this process stored them); called on vLLM's lookup thread."""
        name = self.object_key(key)
        with self._lock:
            if name in self._known:
                return True
        for rank, ident in enumerate(self.identities):
            part = self.object_key(key, rank)
            try:
                if self._store.header(part).get("model") != ident:
                    log.warning("tqkv tier: %s holds another model's or layout's chunk", part)
                    return False
            except tqkv.NotFoundError:
                return False
            except tqkv.Error as e:  # unreadable: a miss, never a load
                log.warning("tqkv tier: %s: %s", part, e)
                return False
        self._remember([name])
        return True

    def _remember(self, names: List[str]) -> None:
        with self._lock:
            for n in names:
                self._known[n] = None
                self._known.move_to_end(n)
            while len(self._known) > _KNOWN_MAX:
                self._known.popitem(last=False)

    def _forget(self, names: List[str]) -> None:
        with self._lock:
            for n in names:
                self._known.pop(n, None)

    def _count(self, **kw: float) -> None:
        with self._lock:
            for k, v in kw.items():
                name = f"vllm:kv_offload_tqkv_{k}"
                self._counters[name] = self._counters.get(name, 0) + v

    # -- vLLM's SecondaryTierManager ---------------------------------------------------------
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        found = self._lookups.lookup(key, req_context)
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        chunks = [int(c) for c in job_metadata.chunk_ids]
        self._submit(self._stores, self._store_job, job_metadata.job_id, keys, chunks)

    def submit_load(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        chunks = [int(c) for c in job_metadata.chunk_ids]
        self._submit(self._loads, self._load_job, job_metadata.job_id, keys, chunks)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        out = []
        while True:
            try:
                result, failed = self._done.get_nowait()
            except queue.Empty:
                return out
            if failed:
                self._lookups.mark_miss(failed)
            out.append(result)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        if self._pin_s > 0 and keys:
            names = [self.object_key(k, g.rank) for k in keys for g in self._geoms]
            self._stores.submit(self._pin, names)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookups.cleanup(req_context.req_id)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookups.flush()

    def drain_jobs(self) -> None:
        with self._lock:
            pending = list(self._pending)
        concurrent.futures.wait(pending)

    def shutdown(self) -> None:
        self._lookups.shutdown()
        self._loads.shutdown(wait=True)
        self._stores.shutdown(wait=True)
        self._kvs = []  # the views export the primary buffer: vLLM closes its mmap after this

    def get_stats(self) -> Any:
        with self._lock:
            counters, self._counters = self._counters, {}
        if not counters:
            return None
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import \
            OffloadingConnectorStats
        stats = OffloadingConnectorStats()
        for name, value in counters.items():
            stats.increase_counter(name, value)
        return stats

    # -- the jobs, on the tier's threads -----------------------------------------------------
    def _submit(self, pool: concurrent.futures.ThreadPoolExecutor, fn: Any, job_id: int,
                keys: List[OffloadKey], chunks: List[int]) -> None:
        fut = pool.submit(self._run, fn, job_id, keys, chunks)
        with self._lock:
            self._pending.add(fut)
        fut.add_done_callback(self._finished)

    def _finished(self, fut: concurrent.futures.Future) -> None:
        with self._lock:
            self._pending.discard(fut)

    def _run(self, fn: Any, job_id: int, keys: List[OffloadKey], chunks: List[int]) -> None:
        t0 = time.monotonic()
        try:
            ok_keys, error = fn(keys, chunks)
        except Exception as e:  # a job never dies silently: vLLM gets a failed result
            ok_keys, error = [], f"{type(e).__name__}: {e}"
        seconds = time.monotonic() - t0
        failed = [] if error is None else keys[len(ok_keys):]
        if error is not None:
            log.warning("tqkv tier: job %d (%d chunks) failed after %d: %s", job_id, len(keys),
                        len(ok_keys), error)
        partial = tuple(ok_keys) if error is not None and ok_keys else None
        # Primary-tier bytes moved, as vLLM's own tiers report them: its back-pressure detector
        # normalizes store latency by them (the compressed bytes are in the tier's counters).
        moved = len(ok_keys) * self.block_size_bytes
        result = JobResult(job_id=job_id, success=error is None, successful_keys=partial,
                           transfer_time=seconds, transfer_bytes=moved or None)
        self._done.put((result, failed if fn == self._load_job else []))

    def _store_job(self, keys: List[OffloadKey], chunks: List[int]) -> tuple:
        """Each worker's part of the chunks, rank by rank (the last rank's object last, so a
        chunk is present only when all are); returns (keys stored, error)."""
        done, error = len(keys), None
        for g, kv, ident in zip(self._geoms, self._kvs, self.identities):
            names = [self.object_key(k, g.rank) for k in keys[:done]]
            res = tqkv.checkpoint_batch(self._store, names, ol.chunk_block_ids(g, chunks[:done]),
                                        kv, models=[ident] * len(names), in_flight=self._in_flight,
                                        skip_existing=True, **self._save)
            done = int(res["done"])
            self._count(write_bytes=res["bytes"],
                        write_kv_bytes=(done - int(res["skipped"])) * g.worker_bytes)
            if res["error"] is not None:
                error = error or res["error"]
        self._remember([self.object_key(k) for k in keys[:done]])
        if error is not None:
            self._count(store_failures=1)
        self._maybe_gc()
        return keys[:done], error

    def _load_job(self, keys: List[OffloadKey], chunks: List[int]) -> tuple:
        """Restores each worker's part of the chunks into their primary rows; each header's
        model string is checked before its part is written. Returns (keys loaded, error)."""
        done, nbytes, error = len(keys), 0, None
        for g, kv, ident in zip(self._geoms, self._kvs, self.identities):
            names = [self.object_key(k, g.rank) for k in keys[:done]]
            res = tqkv.restore_batch(self._store, names, ol.chunk_block_ids(g, chunks[:done]), kv,
                                     models=[ident] * len(names), in_flight=self._in_flight)
            done, nbytes = int(res["done"]), nbytes + int(res["bytes"])
            if res["error"] is not None:
                error = error or res["error"]
        self._count(read_bytes=nbytes)
        if error is not None:
            self._forget([self.object_key(k) for k in keys[done:]])
            self._count(load_failures=len(keys) - done)
        return keys[:done], error

    def _pin(self, names: List[str]) -> None:
        for n in names:
            try:
                self._store.pin(n, ttl=self._pin_s)
            except tqkv.Error as e:  # evicted meanwhile: nothing to keep
                log.debug("tqkv tier: pin %s: %s", n, e)

    def _maybe_gc(self) -> None:
        """Capacity and age limits through the store's own gc (least recently used unpinned
        sessions first; it covers the whole store: give the tier a store of its own)."""
        if not (self._max_bytes or self._ttl_s):
            return
        if time.monotonic() - self._last_gc < self._gc_interval:
            return
        self._last_gc = time.monotonic()
        try:
            report = self._store.gc(max_bytes=self._max_bytes or None, ttl=self._ttl_s or None)
        except tqkv.Error as e:
            log.warning("tqkv tier: gc: %s", e)
            return
        gone = [m["key"] for m in report["expired"] + report["evicted"]]
        self._forget([re.sub(r"\.r\d+$", "", n) for n in gone])  # a lookup reads them again
        if gone:
            log.info("tqkv tier: gc removed %d objects", len(gone))


def _geometry(cfg: Any, view: memoryview, kv_heads: Optional[int], kv_layout: Optional[str],
              head_dim: Optional[int]) -> ol.OffloadGeometry:
    """TP worker 0's KV geometry of vLLM's offload config, with KV heads and head_dim from the tier config
    or the model's config.json (vLLM's offload config gives only bytes per block)."""
    if len(cfg.groups) != 1:
        raise ValueError(f"tqkv tier: {len(cfg.groups)} KV cache groups; the tier stores models "
                         "with one (full attention in every layer)")
    if getattr(cfg, "canonical_layout", False):
        raise ValueError("tqkv tier: the canonical host layout is not supported; leave "
                         "'canonical_layout' off")
    par = cfg.parallel
    if kv_heads is None or head_dim is None:
        heads = ol.model_heads(cfg.model.name, par.tp_size)
        if heads is None:
            raise ValueError(f"tqkv tier: {cfg.model.name!r} is not a local model directory with "
                             "a config.json: set 'kv_heads' (per worker) and 'head_dim' in the "
                             "tier's config")
        kv_heads = heads["kv_heads"] if kv_heads is None else kv_heads
        head_dim = heads["head_dim"] if head_dim is None else head_dim
    group = cfg.groups[0]
    return ol.geometry(layers=len(group.layer_names), kv_heads=int(kv_heads),
                       head_dim=int(head_dim), block_tokens=int(group.tokens_per_block),
                       blocks_per_chunk=int(cfg.cache.blocks_per_chunk), dtype=cfg.model.dtype,
                       layout=kv_layout or cfg.kv_cache_layout, row_bytes=int(view.strides[0]),
                       worker_kv_bytes_per_block=int(cfg.worker_kv_bytes_per_block),
                       world_size=int(par.world_size))

"""The vLLM KV connector class (the only module of tqkv.vllm that imports vLLM; tqkv.vllm builds
it on first use). It hands vLLM's calls to the scheduler side (scheduler.py) and the worker side
(worker.py, writer.py); the library does the rest in one batched call per step."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.logger import init_logger

from .. import _store
from .config import Stats, model_identity, parse_config
from .scheduler import Scheduler
from .worker import Loader, paged_kv
from .writer import ChunkOp, ChunkWriter

logger = init_logger("vllm.tqkv")  # vLLM's log format and level


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


def _cpu_isa(kv0: Any, block: int, head_dim: int, cache_dtype: Any) -> str:
    """vLLM's CPU attention ISA for this cache: which kernel wrote it decides its order."""
    if kv0.dim() != 4 or kv0.device.type != "cpu":
        return ""
    try:  # vLLM internal
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        return str(_get_attn_isa(kv0.dtype, block, head_dim, cache_dtype))
    except Exception as e:  # noqa: BLE001 - unknown: refused by the library
        return f"unknown ({e})"


class TqkvConnector(KVConnectorBase_V1):
    """Saves prompt KV to a tqkv store in chained chunks and restores stored prefixes."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        self._block = vllm_config.cache_config.block_size
        self._cfg = parse_config(extra, self._block)
        self._chunk = self._cfg["chunk_tokens"]
        self._ident, self._geo = model_identity(vllm_config)
        self._cache_dtype = vllm_config.cache_config.cache_dtype
        self._store = _store.open_store(self._cfg["store"])
        self._stats = Stats()
        self._reported: Dict[str, float] = {}
        is_scheduler = role == KVConnectorRole.SCHEDULER
        async_save = self._cfg["async_save"] and not self._cfg["read_only"]
        self._sched = Scheduler(self._store, self._cfg, self._ident, self._geo, self._block,
                                self._stats, logger, async_save) if is_scheduler else None
        self._layers: Dict[str, Any] = {}  # layer name -> kv tensor (from the forward)
        self._order: List[str] = []
        self._kv: Any = None  # the library's view of the cache (tqkv.PagedKV), built once
        self._loader = Loader(self._store, self._stats, logger)
        self._writer: Optional[ChunkWriter] = None
        if not is_scheduler and not self._cfg["read_only"]:
            self._writer = ChunkWriter(self._store, self._cfg["save_kwargs"], self._stats,
                                       self._cfg["save_queue"],
                                       threaded=async_save, log=logger)
        if getattr(self._kv_transfer_config, "kv_load_failure_policy", "recompute") != \
                "recompute":
            logger.warning("tqkv connector: set kv_load_failure_policy='recompute' so that a "
                           "chunk that fails to restore is recomputed, not a failed request")
        logger.info("tqkv connector (%s): store %s, chunk %d tokens, namespace %s, model %s, "
                    "save options %s%s", "scheduler" if is_scheduler else "worker",
                    self._store.uri, self._chunk, self._cfg["namespace"], self._ident,
                    self._cfg["save_kwargs"] or "library defaults",
                    ", read-only" if self._cfg["read_only"] else
                    f", saves in the background (queue {self._cfg['save_queue']} chunks)"
                    if async_save else ", saves in the step")

    # ---- scheduler side ----
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int):
        n = self._sched.matched(request.request_id, request.prompt_token_ids, num_computed_tokens)
        return n, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int):
        self._sched.allocated(request.request_id, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        ops = self._sched.step(scheduler_output)
        return TqkvMeta(loads=ops.loads, saves=ops.saves, flush=ops.flush)

    def request_finished(self, request: Any, block_ids: List[int]):
        return self._sched.finished(request.request_id)

    # ---- worker side ----
    def _view(self) -> Any:
        if self._kv is None:
            first = min(self._layers, key=lambda n: n)
            isa = _cpu_isa(self._layers[first], self._block, self._geo["head_dim"],
                           self._cache_dtype)
            self._kv, self._order, what = paged_kv(self._layers, self._geo, self._block,
                                                   self._chunk, isa)
            logger.info("tqkv connector: %d layers of %s%s", len(self._order), what,
                        " (staged per chunk and layer in the library)" if self._kv.staged
                        else " (decoded in place)")
        return self._kv

    def _collect_layers(self, forward_context: Any) -> None:
        if self._layers:
            return
        for name, layer in forward_context.no_compile_layers.items():
            kv = getattr(layer, "kv_cache", None)
            if kv is not None and hasattr(kv, "shape"):
                self._layers[name] = kv

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        self._layers = dict(kv_caches)
        self._kv = None

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if not meta.loads:
            return
        self._collect_layers(forward_context)
        try:
            kv = self._view()
        except Exception as e:  # noqa: BLE001 - any failure is a miss
            self._loader.fail(list(meta.loads), e)
            return
        self._loader.start(list(meta.loads), kv)

    def wait_for_layer_load(self, layer_name: str) -> None:
        idx = self._order.index(layer_name) if layer_name in self._order else 1 << 29
        self._loader.wait_layer(idx)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        # The chunks are saved from wait_for_save, once every layer of the step is computed:
        # one tqkv session per chunk holds all layers.
        if layer_name not in self._layers:
            self._layers[layer_name] = kv_layer
            self._kv = None

    def wait_for_save(self) -> None:
        self._loader.join()
        meta = self._get_connector_metadata()
        if not meta.saves or self._writer is None:
            return
        try:
            kv: Any = self._view()
        except Exception as e:  # noqa: BLE001
            logger.warning("tqkv connector: cannot save from this KV cache: %s", e)
            kv = None
        # async: queued for the writer thread (waits only while save_queue chunks are queued);
        # else written here, in the step
        waited = self._writer.submit(meta.saves, kv)
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
        return self._loader.take_failed()

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
        self._loader.join()
        if self._writer is not None:
            n, secs = self._writer.close()
            if n:
                logger.info("tqkv connector: shutdown wrote the %d queued chunks in %.3f s",
                            n, secs)
        logger.info("tqkv connector stats: %s", self._stats.snapshot())

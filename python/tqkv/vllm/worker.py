"""The connector's worker side, without vLLM's classes: vLLM's per-layer KV tensors as the
library's paged memory (tqkv.PagedKV), and the batched restore of a step's chunks, run on one
thread so that the forward pass waits for each layer only."""
from __future__ import annotations

import re
import threading
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from .. import _batch, _tqkv
from .writer import ChunkOp


def layer_index(name: str, fallback: int) -> int:
    m = re.search(r"\.(\d+)\.", name)
    return int(m.group(1)) if m else fallback


def paged_kv(layers: Dict[str, Any], geo: Dict[str, Any], block: int, chunk: int,
             isa: str = "") -> Tuple[Any, List[str], str]:
    """(the library's view of vLLM's KV cache, layer names in model order, a description).

    vLLM's CUDA layouts are 5-D per layer: [2, blocks, block, heads, dim] (K and V on the leading
    axis, NHD), [2, blocks, heads, block, dim] (HND) or K/V on the second axis. Its CPU backend
    (``isa`` its attention ISA) keeps [blocks, heads, block, 2 * dim], K and V ordered as that
    ISA's kernels write them (tqkv/vllm_layout.h)."""
    names = sorted(layers, key=lambda n: layer_index(n, 0))
    if len(names) != geo["layers"]:
        raise _tqkv.UnsupportedError(f"{len(names)} KV cache layers, the model has "
                                     f"{geo['layers']}")
    tensors = [layers[n] for n in names]
    kv0, heads, dim = tensors[0], geo["kv_heads"], geo["head_dim"]
    shape = tuple(kv0.shape)
    if kv0.dim() == 4 and shape[-1] == 2 * dim:
        kv = _batch.vllm_cpu_kv(tensors, isa=isa, kv_heads=heads, head_dim=dim, tokens=chunk)
        return kv, names, f"{shape} {kv0.dtype}: vLLM CPU cache, attention ISA {isa}"
    if kv0.dim() == 5 and shape[0] == 2:
        ks, vs = [t[0] for t in tensors], [t[1] for t in tensors]
    elif kv0.dim() == 5 and shape[1] == 2:
        ks, vs = [t[:, 0] for t in tensors], [t[:, 1] for t in tensors]
    else:
        raise _tqkv.UnsupportedError(f"vLLM KV cache layer of shape {shape} (head_dim {dim}, "
                                     f"kv_heads {heads}): layout not understood")
    k = ks[0]
    if k.shape[-1] != dim or k.stride(-1) != 1:
        raise _tqkv.UnsupportedError(f"vLLM KV cache layer {shape}: channels not contiguous")
    if tuple(k.shape[1:3]) == (heads, block):
        layout = "paged_hnd"
    elif tuple(k.shape[1:3]) == (block, heads):
        layout = "paged"
    else:
        raise _tqkv.UnsupportedError(f"vLLM KV cache layer {shape}: no axis pair ({heads} heads, "
                                     f"{block} tokens)")
    kv = _batch.paged_kv(ks, vs, layout=layout, tokens=chunk)
    return kv, names, f"{shape} {kv0.dtype} strides {kv0.stride()}: {layout}"


class Loader:
    """Restores a step's chunks with one tqkv.restore_batch call on a thread of its own; the
    library reads and decodes the chunks on its threads and reports each layer once every
    chunk has it. A chunk that fails fails every later one: their blocks are reported."""

    def __init__(self, store: Any, stats: Any, log: Any) -> None:
        self._store, self._stats, self._log = store, stats, log
        self._cv = threading.Condition()
        self._ready = -1  # layers [0, _ready] are in place in every chunk of the batch
        self._thread: Optional[threading.Thread] = None
        self._failed: Set[int] = set()
        self._waited = 0.0  # the forward's time blocked in wait_layer during this load

    def start(self, ops: List[ChunkOp], kv: Any) -> None:
        with self._cv:
            self._ready = -1
            self._waited = 0.0
        self._thread = threading.Thread(target=self._run, args=(ops, kv),
                                        name="tqkv-vllm-load", daemon=True)
        self._thread.start()

    def fail(self, ops: List[ChunkOp], why: Any) -> None:
        """Reports these chunks' blocks as failed without trying them (the cache is unusable)."""
        self._log.warning("tqkv connector: cannot restore into this KV cache: %s", why)
        for op in ops:
            self._failed.update(op.block_ids)
        self._stats.add(load_failures=len(ops))

    def _layer(self, layer: int) -> None:
        with self._cv:
            self._ready = layer
            self._cv.notify_all()

    def _run(self, ops: List[ChunkOp], kv: Any) -> None:
        t0 = time.perf_counter()
        try:
            res = _batch.restore_batch(self._store, [op.key for op in ops],
                                       [op.block_ids for op in ops], kv,
                                       models=[op.model for op in ops],
                                       tokens=[op.tokens for op in ops], on_layer=self._layer)
            done, error = res["done"], res["error"]
            nbytes, tokens, first = res["bytes"], res["tokens"], res["first_layer_seconds"]
        except Exception as e:  # noqa: BLE001 - any failure is a miss, recomputed by vLLM
            done, error, nbytes, tokens, first = 0, str(e), 0, 0, 0.0
        if error is not None:
            self._log.warning("tqkv connector: restoring %s failed (recomputed, with the %d "
                              "chunks after it): %s", ops[done].key, len(ops) - done - 1, error)
            for op in ops[done:]:
                self._failed.update(op.block_ids)
        secs = time.perf_counter() - t0
        self._stats.add(chunks_loaded=done, bytes_read=nbytes, restore_seconds=secs,
                        load_failures=len(ops) - done)
        self._log.info("tqkv connector: restored %d chunks (%d tokens, %d bytes) in %.3f s "
                       "(layer 0 of every chunk after %.3f s)%s", done, tokens, nbytes, secs,
                       first, f", {len(ops) - done} failed" if done < len(ops) else "")
        with self._cv:
            self._ready = 1 << 30
            self._cv.notify_all()

    def wait_layer(self, index: int) -> None:
        if self._thread is None:
            return
        with self._cv:
            if self._ready >= index:
                return
            t0 = time.perf_counter()
            self._cv.wait_for(lambda: self._ready >= index)
            self._waited += time.perf_counter() - t0

    def join(self) -> None:
        """Waits for the load; once the step's forward is done (wait_for_save), logs how long
        that forward waited for restored layers."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self._stats.add(load_wait_seconds=self._waited)
            self._log.info("tqkv connector: the forward pass waited %.3f s for restored layers",
                           self._waited)

    def take_failed(self) -> Set[int]:
        self.join()
        out, self._failed = self._failed, set()
        return out

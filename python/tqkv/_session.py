"""Checkpoint and restore of KV caches held in numpy arrays or torch tensors.

A cache is given per layer: ``k`` and ``v`` are each a sequence of per-layer arrays, or one
array with a leading layer axis (its per-layer views are used; nothing is copied). Layouts:

- ``"nhd"`` (default, the library's canonical layout): ``[tokens, kv_heads, head_dim]``.
  Contiguous arrays are checkpointed and restored in place, zero copy.
- ``"hnd"``: ``[kv_heads, tokens, head_dim]`` (Hugging Face transformers).
- ``"paged"``: ``[blocks, block_size, kv_heads, head_dim]`` block pools (vLLM) with
  ``block_ids`` saying which block holds tokens ``[i * block_size, (i + 1) * block_size)``.
- ``"paged_hnd"``: ``[blocks, kv_heads, block_size, head_dim]`` block pools (vLLM's head-major
  ``LBHNC`` layout, its CPU backend), with ``block_ids`` as for ``"paged"``.

Restore decodes straight into the caller's arrays in every layout whose last axis is contiguous
(all three above, and views of them); arrays with strided channels go through one layer of
staging (``stats["staged"]``). Checkpoint reads the contiguous canonical layout in place and
gathers other layouts one layer at a time (memory for one layer, not for the session).
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Sequence, Tuple

import numpy as np

from . import _arrays, _errors, _tqkv
from ._store import StoreLike, as_store

_AXES = {"nhd": (0, 1, 2, -1), "hnd": (1, 0, 2, -1), "paged": (1, 2, 3, 0),
         "paged_hnd": (2, 1, 3, 0)}


def _axes(layout: str) -> Any:
    if layout not in _AXES:
        raise _tqkv.InvalidArgumentError(
            f"layout {layout!r}: use 'nhd', 'hnd', 'paged' or 'paged_hnd'")
    a = _tqkv.Axes()
    a.token, a.head, a.dim, a.block = _AXES[layout]
    return a


def _block_size(layer: Any, layout: str) -> int:
    return int(layer.shape[_AXES.get(layout, _AXES["paged"])[0]])


def _layers(x: Any, name: str) -> list:
    if isinstance(x, (list, tuple)):
        return [_arrays.to_core(t) for t in x]
    if hasattr(x, "shape") and len(x.shape) >= 1:
        return [_arrays.to_core(x[i]) for i in range(x.shape[0])]
    raise _tqkv.InvalidArgumentError(f"{name}: a sequence of per-layer arrays or one array")


def _block_ids(block_ids: Any) -> Optional[np.ndarray]:
    if block_ids is None:
        return None
    if _arrays.is_torch(block_ids):
        block_ids = block_ids.cpu().numpy()
    return np.ascontiguousarray(np.asarray(block_ids, dtype=np.int64).reshape(-1))


def settings(*, codec: Optional[str] = None, layer_codecs: Optional[Mapping[int, str]] = None,
             exact_tokens: Optional[Tuple[int, int]] = None, key_means: Optional[str] = None,
             strict: Optional[bool] = None, guard: Optional[bool] = None,
             alignment: Optional[int] = None) -> Any:
    """The library's settings object for these arguments; ``None`` leaves the library's default
    (the one resolver every front end uses: the ``tqkv`` command, tqkv.llama, tqkv.vllm)."""
    overrides = [f"{int(layer)}:{spec}" for layer, spec in sorted((layer_codecs or {}).items())]
    exact = None
    if exact_tokens is not None:
        if isinstance(exact_tokens, str) or len(exact_tokens) != 2:
            raise _tqkv.InvalidArgumentError(
                f"exact_tokens {exact_tokens!r}: a pair (first, last) of token counts")
        exact = f"{int(exact_tokens[0])},{int(exact_tokens[1])}"
    align = None if alignment is None else int(alignment)
    return _tqkv.checkpoint_settings(codec, overrides, exact, key_means, strict, guard, align)


def resolve_settings(**options: Any) -> Dict[str, Any]:
    """What a checkpoint with these settings (the keyword arguments of ``checkpoint``: codec,
    layer_codecs, exact_tokens, key_means, strict, guard, alignment) stores, with every default
    filled in: ``{'codec': 'tq3', 'layer_codecs': [], 'exact_tokens': '0,4', 'key_means': '128',
    ..., 'alignment': 4096}``."""
    return _tqkv.resolve_settings(settings(**options))


def checkpoint(store: StoreLike, key: str, k: Any, v: Any, *, codec: Optional[str] = None,
               layer_codecs: Optional[Mapping[int, str]] = None,
               exact_tokens: Optional[Tuple[int, int]] = None, key_means: Optional[str] = None,
               strict: Optional[bool] = None, guard: Optional[bool] = None,
               alignment: Optional[int] = None, layout: str = "nhd", block_ids: Any = None,
               tokens: Optional[int] = None, model: str = "",
               token_block: int = 0) -> Dict[str, Any]:
    """Encodes the cache ``k``, ``v`` and publishes it atomically under ``key``.

    Settings (``None``, the default of each, takes the library's default, the same as the
    ``tqkv`` command's; ``resolve_settings`` shows what they resolve to):
    ``codec``: the spec of every layer (default ``tq3``; ``tq2.5``, ``fp16``, ... see
    tqkv.Codec), separate K and V codecs (``k4v2``: K tq4, V tq2; ``k:tq4,norm=f16/v:fp16``) or
    the bit allocator (``auto:3.5``; docs/codec.md §3); ``layer_codecs``: per-layer overrides,
    e.g. ``{0: "tq4", 27: "k4v3"}``; ``exact_tokens``: ``(first, last)`` tokens also stored
    exactly (attention sinks, recent tokens; default ``(0, 4)`` when some layer's codec is lossy,
    ``(0, 0)`` when every layer is stored raw); ``key_means``: the keys' mean removed before
    encoding, per block of that many tokens (default ``"128"``), ``"session"`` or ``"off"``,
    optionally ``",f32"`` (docs/format.md §5); ``guard``: measure and store each layer's codec
    error (default True); ``strict``: refuse the checkpoint (InvalidArgumentError, nothing
    stored) when some layer's error exceeds the guard's threshold (default False: the returned
    ``guard_exceeded`` lists them); ``alignment``: where payloads start in the file, a power of
    two from 64 to 4096 (default 4096, which lets O_DIRECT read each chunk; 64 packs a small
    session: format version 9, docs/format.md).
    ``layout``/``block_ids``: see the module docs; ``tokens``: for paged caches, the session
    length (default ``len(block_ids) * block_size``); ``model``: a name stored in the header.
    Returns the library's figures: ``bytes_written``, ``fp16_bytes``, ``seconds``, ...,
    ``codec_error`` (per layer, K's and V's error relative to the vectors' varying part),
    ``guard_exceeded`` (``(layer, "K" or "V", error)`` over the threshold), ``allocated``
    (``auto:B``'s choice per layer) and ``settings`` (as resolved).
    On failure nothing readable is left under ``key``.
    """
    kl, vl = _layers(k, "k"), _layers(v, "v")
    if any(_arrays.is_cuda(t) for t in kl + vl):
        raise _tqkv.InvalidArgumentError(
            "checkpoint reads host memory: move CUDA tensors to the CPU first (tensor.cpu())")
    ids = _block_ids(block_ids)
    if tokens is None:
        tokens = 0 if ids is None or not kl else len(ids) * _block_size(kl[0], layout)
    resolved = settings(codec=codec, layer_codecs=layer_codecs, exact_tokens=exact_tokens,
                        key_means=key_means, strict=strict, guard=guard, alignment=alignment)
    return _tqkv.checkpoint(as_store(store)._s, key, kl, vl, _axes(layout), ids, int(tokens),
                            resolved, model, int(token_block))


def _destination(store: Any, key: str, out: Any, dtype: Any, layout: str, block_ids: Any,
                 tokens: Optional[int], array: str, device: Any) -> Tuple[Any, Any, list, list, int]:
    if out is not None:
        k, v = out
        kl, vl = _layers(k, "out[0]"), _layers(v, "out[1]")
        if not _tqkv.built_with_cuda() and any(_arrays.is_cuda(t) for t in kl + vl):
            raise _tqkv.InvalidArgumentError(_tqkv.NO_CUDA_MESSAGE)
        ids = _block_ids(block_ids)
        n = tokens if tokens is not None else (
            len(ids) * _block_size(kl[0], layout) if ids is not None and kl else 0)
        return k, v, kl, vl, int(n)
    if layout.startswith("paged"):
        raise _tqkv.InvalidArgumentError("a paged restore writes into out=(k_blocks, v_blocks)")
    if _arrays.is_cuda_device(device):
        if not _tqkv.built_with_cuda():
            raise _tqkv.InvalidArgumentError(_tqkv.NO_CUDA_MESSAGE)
        if array != "torch":
            raise _tqkv.InvalidArgumentError(
                "device='cuda' restores into torch tensors: pass array='torch' "
                "(or out= CUDA arrays of any DLPack library)")
    h = _tqkv.header(store._s, key)
    per_layer = ((h["tokens"], h["kv_heads"], h["head_dim"]) if layout == "nhd"
                 else (h["kv_heads"], h["tokens"], h["head_dim"]))
    shape = (h["layers"],) + per_layer
    name = _arrays.dtype_name(dtype)
    k = _arrays.empty(shape, name, array, device)
    v = _arrays.empty(shape, name, array, device)
    return k, v, _layers(k, "k"), _layers(v, "v"), 0


def restore(store: StoreLike, key: str, *, out: Optional[Tuple[Any, Any]] = None,
            dtype: Any = "float16", layout: str = "nhd", block_ids: Any = None,
            tokens: Optional[int] = None, on_layer: Optional[Callable[[int, Any, Any], Any]] = None,
            array: str = "numpy", device: Any = None, drop_cache: bool = False,
            stats: Optional[Dict[str, Any]] = None) -> Tuple[Any, Any]:
    """Restores session ``key``; returns ``(k, v)``.

    Without ``out``: new arrays ``[layers, tokens, kv_heads, head_dim]`` (``layout="hnd"``:
    ``[layers, kv_heads, tokens, head_dim]``) of ``dtype`` (float16, bfloat16 — ml_dtypes'
    type when installed, else raw uint16 — or float32), numpy or ``array="torch"``.
    With ``out=(k, v)``: the caller's writable arrays (per-layer sequences or one array each),
    whose geometry and token count must match the session (InvalidArgumentError saying what
    differs) and whose dtype is the restored type, in ``layout`` (``block_ids``/``tokens`` for
    paged pools); decoded into directly, zero copy, whenever their last axis is contiguous
    (``stats["staged"]`` is False).
    ``on_layer(layer, k_layer, v_layer)``: called as soon as each layer is decoded and verified,
    in order, from the restoring thread, so an engine can start on layer 0 early (raising in it
    stops the restore). ``stats``: a dict to fill with the library's figures.
    CUDA: ``device="cuda"`` (with ``array="torch"``) or ``out=`` CUDA arrays (torch, CuPy, any
    DLPack producer) restore through the library's GPU restore, decoded straight into the arrays
    (``staged`` False; last axis contiguous) when the package is built with CUDA (``tqkv.CUDA``);
    otherwise they raise InvalidArgumentError saying so.
    The GIL is released while the session is read and decoded.
    """
    if array not in ("numpy", "torch"):
        raise _tqkv.InvalidArgumentError(f"array: 'numpy' or 'torch', got {array!r}")
    paged = isinstance(layout, str) and layout.startswith("paged")
    if block_ids is not None and not paged:
        raise _tqkv.InvalidArgumentError(
            f"block_ids go with layout='paged' or 'paged_hnd', not {layout!r}")
    if on_layer is not None and not callable(on_layer):
        raise _tqkv.InvalidArgumentError(f"on_layer: a callable, got {type(on_layer).__name__}")
    st = as_store(store, create=False)
    if out is None and not paged and not _arrays.is_cuda_device(device):
        return _restore_new(st, key, dtype, layout, array, device, on_layer, drop_cache, stats)
    k, v, kl, vl, n = _destination(st, key, out, dtype, layout, block_ids, tokens, array, device)
    figures = _tqkv.restore_into(st._s, key, kl, vl, _axes(layout), _block_ids(block_ids), n,
                                 _ready(on_layer, lambda: (kl, vl)), drop_cache, 0)
    if stats is not None:
        stats.update(figures)
    return k, v


def _ready(on_layer: Optional[Callable[[int, Any, Any], Any]],
           layers: Callable[[], Tuple[list, list]]) -> Optional[Callable[[int], None]]:
    """The library's layer_ready for ``on_layer(layer, k_layer, v_layer)``; what the caller's
    callback raises propagates unchanged, not as a tqkv.Error."""
    if on_layer is None:
        return None

    def ready(layer: int) -> None:
        kl, vl = layers()
        try:
            on_layer(layer, kl[layer], vl[layer])
        except BaseException as e:
            _errors.mark_callers(e)
            raise
    return ready


def _restore_new(st: Any, key: str, dtype: Any, layout: str, array: str, device: Any,
                 on_layer: Optional[Callable[[int, Any, Any], Any]], drop_cache: bool,
                 stats: Optional[Dict[str, Any]]) -> Tuple[Any, Any]:
    """Restore into new host arrays, allocated once the library has read the header (the object
    is opened once)."""
    made: Dict[str, Any] = {}
    name = _arrays.dtype_name(dtype)

    def allocate(h: Dict[str, Any]) -> Tuple[list, list]:
        per_layer = ((h["tokens"], h["kv_heads"], h["head_dim"]) if layout == "nhd"
                     else (h["kv_heads"], h["tokens"], h["head_dim"]))
        shape = (h["layers"],) + per_layer
        made["k"] = _arrays.empty(shape, name, array, device)
        made["v"] = _arrays.empty(shape, name, array, device)
        made["kl"], made["vl"] = _layers(made["k"], "k"), _layers(made["v"], "v")
        return made["kl"], made["vl"]

    figures = _tqkv.restore_new(st._s, key, _axes(layout), allocate,
                                _ready(on_layer, lambda: (made["kl"], made["vl"])), drop_cache, 0)
    if stats is not None:
        stats.update(figures)
    return made["k"], made["v"]


def restore_layers(store: StoreLike, key: str, **options: Any) -> Iterator[Tuple[int, Any, Any]]:
    """Restores like ``restore`` (same options, no ``on_layer``), yielding
    ``(layer, k_layer, v_layer)`` as soon as each layer is decoded; the library keeps decoding
    the next layers meanwhile. Leaving the loop early stops the restore."""
    if "on_layer" in options:
        raise _tqkv.InvalidArgumentError("restore_layers yields the layers: no on_layer")
    done = object()
    ready: "queue.Queue[Any]" = queue.Queue()
    stop = threading.Event()

    def on_layer(layer: int, kl: Any, vl: Any) -> None:
        if stop.is_set():
            raise _Stopped()
        ready.put((layer, kl, vl))

    def run() -> None:
        try:
            restore(store, key, on_layer=on_layer, **options)
            ready.put(done)
        except BaseException as e:  # handed to the consumer
            ready.put(e)

    worker = threading.Thread(target=run, name=f"tqkv-restore-{key}", daemon=True)
    worker.start()
    try:
        while True:
            item = ready.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        worker.join()


class _Stopped(Exception):
    """The consumer of restore_layers left the loop."""

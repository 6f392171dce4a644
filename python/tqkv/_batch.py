"""Batches of stored sessions moved to and from an engine's paged KV memory in one call
(include/tqkv/batch.h): the chunks of a prompt restored into the blocks an engine allocated, or
checkpointed from them. The library reads, decodes (or encodes, writes) several objects at once
on its threads with the GIL released, and reports each layer once for the whole batch.

    kv = tqkv.paged_kv(k_blocks, v_blocks, layout="paged_hnd", tokens=256)  # once per engine
    res = tqkv.restore_batch(store, ["c0", "c1"], [ids0, ids1], kv, on_layer=print)
    res["done"], res["error"]   # objects restored in order before the first failure
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence


from . import _arrays, _errors, _tqkv
from ._session import _axes, _block_ids, _layers, settings as _settings
from ._store import StoreLike, as_store


class PagedKV:
    """An engine's paged K/V memory as the batch calls see it, built once (``paged_kv``,
    ``vllm_cpu_kv``) and reused; it keeps the arrays alive."""

    def __init__(self, core: Any) -> None:
        self._a = core

    @property
    def tokens(self) -> int:
        """Tokens of each stored object."""
        return int(self._a.tokens)

    @property
    def staged(self) -> bool:
        """True when K or V is not decoded in place (strided channels, tiles): each object is
        decoded a layer at a time into host memory and copied into its blocks."""
        return bool(self._a.staged)


def paged_kv(k: Any, v: Any, *, layout: str = "paged", tokens: int) -> PagedKV:
    """Block pools ``k``, ``v`` (per-layer sequences or one array each, ``layout`` 'paged':
    ``[blocks, block_size, kv_heads, head_dim]`` or 'paged_hnd': ``[blocks, kv_heads, block_size,
    head_dim]``, host or CUDA) holding objects of ``tokens`` tokens each."""
    if not isinstance(layout, str) or not layout.startswith("paged"):
        raise _tqkv.InvalidArgumentError(f"layout {layout!r}: 'paged' or 'paged_hnd'")
    kl, vl = _layers(k, "k"), _layers(v, "v")
    if not _tqkv.built_with_cuda() and any(_arrays.is_cuda(t) for t in kl + vl):
        raise _tqkv.InvalidArgumentError(_tqkv.NO_CUDA_MESSAGE)
    return PagedKV(_tqkv.paged_arrays(kl, vl, _axes(layout), int(tokens)))


def vllm_cpu_kv(layers: Sequence[Any], *, isa: str, kv_heads: int, head_dim: int,
                tokens: int) -> PagedKV:
    """vLLM's CPU cache: one ``[blocks, kv_heads, block_size, 2 * head_dim]`` tensor per layer,
    K and V of each block and head ordered as attention ISA ``isa`` ('vec', 'vec16', 'amx')
    writes them; the library reads and writes those orders itself (tqkv/vllm_layout.h)."""
    arrays = [_arrays.to_core(t) for t in layers]
    return PagedKV(_tqkv.vllm_cpu_arrays(arrays, str(isa), int(kv_heads), int(head_dim),
                                         int(tokens)))


def _ids(block_ids: Sequence[Any], n: int) -> list:
    if len(block_ids) != n:
        raise _tqkv.InvalidArgumentError(f"block_ids: one list per key ({n}), got "
                                         f"{len(block_ids)}")
    return [_block_ids(b) for b in block_ids]


def _tokens(tokens: Optional[Sequence[int]], n: int) -> list:
    if tokens is None:
        return []
    out = [int(t) for t in tokens]
    if len(out) != n or any(t < 0 for t in out):
        raise _tqkv.InvalidArgumentError(f"tokens: one count >= 0 per key ({n}), got {tokens!r}")
    return out


def restore_batch(store: StoreLike, keys: Sequence[str], block_ids: Sequence[Any], kv: PagedKV,
                  *, models: Optional[Sequence[str]] = None,
                  tokens: Optional[Sequence[int]] = None,
                  on_layer: Optional[Callable[[int], Any]] = None, in_flight: int = 0,
                  drop_cache: bool = False) -> Dict[str, Any]:
    """Restores each ``keys[i]`` into the blocks ``block_ids[i]`` of ``kv``; returns ``done``
    (objects restored, in order, before the first failure), ``error`` (None, or the first
    failure's message: that object and every later one were not restored), ``bytes``,
    ``fp16_bytes``, ``tokens``, ``seconds``, ``first_layer_seconds``.

    ``models[i]``: the model string object i's header must hold (a different one is a failure,
    found before a byte of its blocks is written); geometry and token count are checked too.
    ``tokens[i]``: object i's tokens, in its first blocks (0 or absent: ``kv.tokens``), as for
    the shorter last chunk of a prompt.
    ``on_layer(layer)``: called once per layer, in order, as soon as that layer of every object is
    in place. ``in_flight``: objects read and decoded at once (0: the library's default)."""
    st = as_store(store, create=False)
    keys = [str(k) for k in keys]
    if on_layer is not None and not callable(on_layer):
        raise _tqkv.InvalidArgumentError(f"on_layer: a callable, got {type(on_layer).__name__}")

    def ready(layer: int) -> None:
        try:
            on_layer(layer)  # type: ignore[misc]
        except BaseException as e:
            _errors.mark_callers(e)
            raise
    return _tqkv.restore_batch(st._s, keys, [str(m) for m in models or []],
                               _ids(block_ids, len(keys)), _tokens(tokens, len(keys)), kv._a,
                               ready if on_layer is not None else None, bool(drop_cache),
                               int(in_flight))


def checkpoint_batch(store: StoreLike, keys: Sequence[str], block_ids: Sequence[Any], kv: PagedKV,
                     *, models: Optional[Sequence[str]] = None,
                     first_tokens: Optional[Sequence[int]] = None,
                     tokens: Optional[Sequence[int]] = None, codec: Optional[str] = None,
                     exact_head: int = 0, key_means: Optional[str] = None,
                     guard: Optional[bool] = None, alignment: Optional[int] = None,
                     in_flight: int = 0, skip_existing: bool = True) -> Dict[str, Any]:
    """Checkpoints the tokens in blocks ``block_ids[i]`` of ``kv`` as ``keys[i]`` (header model
    ``models[i]``), each published atomically; returns ``done``, ``skipped`` (already stored,
    left as they were), ``error``, ``bytes`` (written), ``fp16_bytes``, ``tokens``, ``seconds``,
    ``settings``. The objects are chunks of a prompt starting at ``first_tokens[i]``: the
    prompt's first ``exact_head`` tokens are also stored exactly, in the objects that hold them;
    no chunk has an exact tail (a prompt's last tokens change every turn). ``tokens[i]``: object
    i's tokens, in its first blocks (0 or absent: ``kv.tokens``). ``codec``,
    ``key_means``, ``guard``, ``alignment``: as ``tqkv.checkpoint``."""
    st = as_store(store)
    keys = [str(k) for k in keys]
    resolved = _settings(codec=codec, exact_tokens=(int(exact_head), 0), key_means=key_means,
                         guard=guard, alignment=alignment)
    firsts = [int(t) for t in first_tokens] if first_tokens is not None else []
    return _tqkv.checkpoint_batch(st._s, keys, [str(m) for m in models or []],
                                  _ids(block_ids, len(keys)), firsts,
                                  _tokens(tokens, len(keys)), kv._a, resolved, 0,
                                  int(in_flight), bool(skip_existing))

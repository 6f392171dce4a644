"""vLLM's CPU offload buffer as the library sees it: where the K and V of each layer, block, head
and token of a chunk lie in the primary tier's rows, and the identity a stored chunk carries.
Used by the tqkv tier (tier.py); imports no vLLM.

vLLM 0.32 (kv_offload/cpu, RFC #42082): the primary tier is one buffer of ``num_chunks`` rows;
a row holds, per TP worker, that worker's pages of one chunk (``blocks_per_chunk`` GPU blocks).
A page is one GPU block of a canonical KV tensor in its physical order: logical axes
``[L, B, H, N, C]`` (layer, block, KV head, token in block, channel) with ``C = 2 * head_dim``,
K in channels ``[0, D)`` and V in ``[D, 2D)``. Layer-outer layouts (LBNHC = "NHD", LBHNC =
"HND") have one canonical tensor per layer, so a worker's row is ``[layer][block][page]``;
block-outer ones (BLNHC, BLHNC) one tensor for all layers, a row ``[block][layer][page]``.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

# In every stored chunk's header model string; bump when the bytes a chunk holds change.
TIER_FORMAT = "tqkv-vllm-tier/1"

# Layouts vLLM's offloading copies page by page (block-compact), by their physical axis order.
_ALIASES = {"NHD": "LBNHC", "HND": "LBHNC"}
_LAYOUTS = ("LBNHC", "LBHNC", "BLNHC", "BLHNC")
_ELEMENT_BYTES = {"float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class OffloadGeometry:
    """One worker's share of a primary-tier row and what it holds."""
    layers: int
    kv_heads: int          # this worker's KV heads
    head_dim: int
    block_tokens: int      # tokens of a GPU block (N)
    blocks_per_chunk: int  # GPU blocks per offloaded chunk (vLLM's blocks_per_chunk)
    dtype: str             # 'float16' or 'bfloat16'
    layout: str            # one of _LAYOUTS
    row_bytes: int         # a primary row (all workers, padding included)
    rank: int = 0
    world_size: int = 1

    @property
    def page_bytes(self) -> int:
        """One layer's page of one GPU block: H * N * 2D elements."""
        return self.kv_heads * self.block_tokens * 2 * self.head_dim * _ELEMENT_BYTES[self.dtype]

    @property
    def worker_bytes(self) -> int:
        """This worker's part of a row: every layer's pages of the chunk's blocks."""
        return self.layers * self.blocks_per_chunk * self.page_bytes

    @property
    def chunk_tokens(self) -> int:
        return self.block_tokens * self.blocks_per_chunk

    @property
    def layer_outer(self) -> bool:
        return self.layout.startswith("L")

    @property
    def block_stride_bytes(self) -> int:
        """From one GPU block of a layer to the next within a row."""
        return self.page_bytes if self.layer_outer else self.layers * self.page_bytes

    def layer_offset(self, layer: int) -> int:
        """Bytes from the worker's part of a row to layer ``layer``'s first page."""
        per_layer = self.blocks_per_chunk * self.page_bytes if self.layer_outer else self.page_bytes
        return self.rank * self.worker_bytes + layer * per_layer

    def block_ids(self, chunk: int) -> np.ndarray:
        """The paged block ids of primary row ``chunk``'s GPU blocks in host_kv's views."""
        per_row = self.row_bytes // self.block_stride_bytes
        return np.arange(self.blocks_per_chunk, dtype=np.int64) + chunk * per_row


def resolve_layout(name: Optional[str]) -> str:
    """vLLM's KV cache layout name (or its NHD/HND alias) as one of the layouts the tier reads;
    None means vLLM's default on GPUs, NHD."""
    layout = _ALIASES.get(name or "NHD", name or "NHD")
    if layout not in _LAYOUTS:
        raise ValueError(f"tqkv tier: KV cache layout {name!r} is not block-compact (use one of "
                         f"{', '.join(_LAYOUTS)} or NHD/HND)")
    return layout


def model_heads(model: str, tp_size: int) -> Optional[Dict[str, int]]:
    """KV heads per worker and head_dim from a local model directory's config.json (None when
    ``model`` is not one): what the KV geometry is, which vLLM's offload config does not say."""
    path = os.path.join(model, "config.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg = cfg.get("text_config", cfg)
    heads = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    return {"kv_heads": max(1, heads // max(1, tp_size)), "head_dim": head_dim}


def geometry(*, layers: int, kv_heads: int, head_dim: int, block_tokens: int,
             blocks_per_chunk: int, dtype: str, layout: Optional[str], row_bytes: int,
             worker_kv_bytes_per_block: int, rank: int = 0, world_size: int = 1) -> OffloadGeometry:
    """Checks that the geometry accounts for vLLM's bytes per block and row exactly; a model whose
    pages hold anything else (MLA, quantized caches, several KV groups) is refused here."""
    dtype = str(dtype).replace("torch.", "")
    if dtype not in _ELEMENT_BYTES:
        raise ValueError(f"tqkv tier: KV cache dtype {dtype!r}: float16 or bfloat16 only")
    g = OffloadGeometry(layers, kv_heads, head_dim, block_tokens, blocks_per_chunk, dtype,
                        resolve_layout(layout), row_bytes, rank, world_size)
    if g.layers * g.page_bytes != worker_kv_bytes_per_block:
        raise ValueError(
            f"tqkv tier: {layers} layers x {kv_heads} KV heads x {block_tokens} tokens x 2 x "
            f"{head_dim} x {_ELEMENT_BYTES[dtype]} bytes = {g.layers * g.page_bytes} bytes per "
            f"block, but vLLM's worker holds {worker_kv_bytes_per_block}: this model's KV pages "
            "are not plain K and V (MLA, a quantized cache or several KV cache groups)")
    if row_bytes < world_size * g.worker_bytes or row_bytes % g.block_stride_bytes:
        raise ValueError(f"tqkv tier: a primary row of {row_bytes} bytes does not hold "
                         f"{world_size} x {g.worker_bytes} bytes in whole blocks")
    return g


def identity(g: OffloadGeometry, model: str) -> str:
    """The model string every stored chunk's header holds (at most 256 bytes): a lookup or load
    matches only chunks of the same model, geometry, layout, block size, dtype and TP rank."""
    name = model.rstrip("/").rsplit("/", 1)[-1][:64]
    whole = (f"{model}|L={g.layers}|H={g.kv_heads}|D={g.head_dim}|N={g.block_tokens}|"
             f"B={g.blocks_per_chunk}|{g.dtype}|{g.layout}|tp={g.world_size}|rank={g.rank}")
    digest = hashlib.blake2b(whole.encode(), digest_size=10).hexdigest()
    return (f"{TIER_FORMAT} {name} id={digest} L={g.layers} H={g.kv_heads} D={g.head_dim} "
            f"N={g.block_tokens}x{g.blocks_per_chunk} {g.dtype} {g.layout} rank={g.rank}/"
            f"{g.world_size}")


def host_kv(primary: Any, g: OffloadGeometry) -> Dict[str, List[Any]]:
    """Per-layer K and V views of this worker's pages in the primary buffer (any object with
    the buffer protocol, e.g. the tier's memoryview), as 4-D torch tensors
    ``[blocks, N, H, D]`` ('paged') or ``[blocks, H, N, D]`` ('paged_hnd') whose block b is
    ``b * block_stride_bytes`` from the layer's first page of row 0: block_ids() addresses them."""
    import torch  # vLLM's dependency; bfloat16 views need it

    flat = torch.frombuffer(primary, dtype=torch.uint8) if not isinstance(primary, torch.Tensor) \
        else primary.view(torch.uint8).reshape(-1)
    elt = _ELEMENT_BYTES[g.dtype]
    data = flat.view(torch.float16 if g.dtype == "float16" else torch.bfloat16)
    h, n, d = g.kv_heads, g.block_tokens, g.head_dim
    nhd = g.layout in ("LBNHC", "BLNHC")
    shape, strides = ((n, h, d), (h * 2 * d, 2 * d, 1)) if nhd else \
        ((h, n, d), (n * 2 * d, 2 * d, 1))
    bstride = g.block_stride_bytes // elt
    # Every view has the same shape (the library wants it): the blocks the last layer's fit.
    last = g.layer_offset(g.layers - 1) // elt
    blocks = (data.numel() - last - g.page_bytes // elt) // bstride + 1
    k, v = [], []
    for layer in range(g.layers):
        start = g.layer_offset(layer) // elt
        for half, out in ((0, k), (d, v)):
            out.append(torch.as_strided(data, (blocks,) + shape, (bstride,) + strides,
                                        start + half))
    return {"k": k, "v": v, "layout": "paged" if nhd else "paged_hnd"}


def chunk_block_ids(g: OffloadGeometry, chunks: Sequence[int]) -> List[np.ndarray]:
    return [g.block_ids(int(c)) for c in chunks]

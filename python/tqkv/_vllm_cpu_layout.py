"""K and V of vLLM's CPU paged KV cache (no vLLM import; torch tensors).

vLLM 0.32's CPU backend keeps a layer as one [blocks, H, N, 2 * head_dim] tensor that
cpu_attn.py splits per block and head into K (the first N * head_dim elements) and V (the rest);
how each half is ordered depends on the attention ISA whose reshape_and_cache wrote it
(csrc/cpu/cpu_attn_vec*.hpp, cpu_attn_amx.hpp):

  vec, vec16   K channel-major [head_dim, N]; V token-major [N, head_dim]: strided views.
  amx (bf16)   K as [N / 16, head_dim / 2, 16, 2]: 16-token groups of channel pairs (the AMX B
               tile of QK^T); V as [head_dim / 16, N / 2, 16, 2]: 16-channel groups of token
               pairs (the B tile of PV). Neither is a strided view of [N, head_dim], so each is a
               PackedHalf that copies blocks out and back.
"""
from __future__ import annotations

from typing import Any, Sequence, Tuple

from . import _tqkv


class PackedHalf:
    """K or V of the AMX layout: ``x[block_ids]`` is a contiguous [len, H, N, head_dim] copy of
    those blocks, ``x[block_ids] = y`` writes such a tensor back in the packed order."""

    def __init__(self, half: Any, n: int, head_dim: int, key: bool) -> None:
        b, h = half.shape[:2]
        if key:  # [g, c // 2, t % 16, c % 2] -> [g, t % 16, c // 2, c % 2]
            self._packed = half.view(b, h, n // 16, head_dim // 2, 16, 2)
            self._order = (0, 1, 2, 4, 3, 5)
        else:  # [c // 16, t // 2, c % 16, t % 2] -> [t // 2, t % 2, c // 16, c % 16]
            self._packed = half.view(b, h, head_dim // 16, n // 2, 16, 2)
            self._order = (0, 1, 3, 5, 2, 4)
        self.shape = (b, h, n, head_dim)

    def __getitem__(self, block_ids: Sequence[int]) -> Any:
        p = self._packed[list(block_ids)].permute(*self._order)
        return p.reshape(p.shape[0], *self.shape[1:])

    def __setitem__(self, block_ids: Sequence[int], value: Any) -> None:
        logical = [self._packed.shape[i] for i in self._order]
        split = value.reshape(len(block_ids), *logical[1:])
        inverse = [self._order.index(i) for i in range(6)]
        self._packed[list(block_ids)] = split.permute(*inverse)


def split_cpu_kv(kv: Any, head_dim: int, kv_heads: int, block_size: int,
                 isa: str) -> Tuple[Any, Any]:
    """K, V of one layer of the 4-D CPU cache: strided [blocks, H, N, head_dim] views, or
    PackedHalf objects; UnsupportedError for an ISA or shape whose layout is not known."""
    if not kv.is_contiguous() or tuple(kv.shape[1:3]) != (kv_heads, block_size):
        raise _tqkv.UnsupportedError(f"vLLM CPU KV cache layer {tuple(kv.shape)} strides "
                                     f"{kv.stride()}: not [blocks, {kv_heads}, "
                                     f"{block_size}, {2 * head_dim}] contiguous")
    b, h, n = kv.shape[:3]
    flat = kv.view(b, h, 2 * n * head_dim)
    k_half, v_half = flat[:, :, :n * head_dim], flat[:, :, n * head_dim:]
    if isa in ("vec", "vec16"):
        return (k_half.view(b, h, head_dim, n).transpose(2, 3),
                v_half.view(b, h, n, head_dim))
    if isa == "amx" and kv.element_size() == 2 and n % 32 == 0 and head_dim % 32 == 0:
        return (PackedHalf(k_half, n, head_dim, key=True),
                PackedHalf(v_half, n, head_dim, key=False))
    raise _tqkv.UnsupportedError(f"vLLM CPU attention ISA {isa!r} ({kv.dtype}, block "
                                 f"{block_size}, head_dim {head_dim}): its cache layout is not "
                                 "known to the connector (vec, vec16, amx)")


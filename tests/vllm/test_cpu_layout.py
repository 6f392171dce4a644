"""The connector's views of vLLM's CPU KV cache (tqkv._vllm_cpu_layout), without a server: a
cache filled element by element in the order each attention ISA's reshape_and_cache writes
(vLLM 0.32, csrc/cpu/cpu_attn_vec.hpp and cpu_attn_amx.hpp), read back as [N, head_dim] per
block and head, and written back."""
import pytest

torch = pytest.importorskip("torch")

from tqkv import _tqkv  # noqa: E402
from tqkv._vllm_cpu_layout import split_cpu_kv  # noqa: E402

BLOCKS, HEADS, N, D = 5, 2, 64, 64


def filled(isa):
    """(cache, logical K, logical V): the cache as `isa`'s kernels lay out token t, channel c."""
    g = torch.Generator().manual_seed(3)
    k = torch.randn(BLOCKS, HEADS, N, D, generator=g).to(torch.bfloat16)
    v = torch.randn(BLOCKS, HEADS, N, D, generator=g).to(torch.bfloat16)
    cache = torch.zeros(BLOCKS, HEADS, N, 2 * D, dtype=torch.bfloat16)
    flat = cache.view(BLOCKS, HEADS, 2 * N * D)
    for t in range(N):
        for c in range(D):
            if isa == "amx":  # K: 32-bit words of channel pairs, 16 tokens a group
                ko = (t // 16) * 16 * D + (c // 2) * 32 + (t % 16) * 2 + c % 2
                # V: 16-channel groups of N * 16; in a group, token pairs of 32 elements
                vo = (c // 16) * N * 16 + (t // 2) * 32 + (c % 16) * 2 + t % 2
            else:  # vec: K channel-major, V token-major
                ko, vo = c * N + t, t * D + c
            flat[:, :, ko] = k[:, :, t, c]
            flat[:, :, N * D + vo] = v[:, :, t, c]
    return cache, k, v


@pytest.mark.parametrize("isa", ["vec", "amx"])
def test_views_read_and_write_the_kernels_order(isa):
    cache, k, v = filled(isa)
    kv, vv = split_cpu_kv(cache, D, HEADS, N, isa)
    ids = [3, 0, 4]
    assert torch.equal(kv[ids], k[ids]) and torch.equal(vv[ids], v[ids])
    # written back (a restore): the cache becomes what the kernels would have written
    empty = torch.zeros_like(cache)
    ke, ve = split_cpu_kv(empty, D, HEADS, N, isa)
    ke[list(range(BLOCKS))] = k
    ve[list(range(BLOCKS))] = v
    assert torch.equal(empty, cache)


def test_unknown_isa_or_shape_is_unsupported():
    cache, _, _ = filled("vec")
    for isa in ("neon", "unknown (x)"):
        with pytest.raises(_tqkv.UnsupportedError, match="not known"):
            split_cpu_kv(cache, D, HEADS, N, isa)
    with pytest.raises(_tqkv.UnsupportedError, match="not known"):  # AMX wants 2-byte elements
        split_cpu_kv(cache.float(), D, HEADS, N, "amx")
    with pytest.raises(_tqkv.UnsupportedError, match="contiguous"):
        split_cpu_kv(cache.transpose(1, 2), D, HEADS, N, "vec")

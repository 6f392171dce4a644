"""The connector's settings (kv_connector_extra_config), the model identity its chunks are keyed
by, and its counters. Imports no vLLM."""
from __future__ import annotations

import hashlib
import re
import threading
from typing import Any, Dict, Tuple

_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

# Tokens per stored chunk unless configured, rounded up to a multiple of vLLM's block size. Every
# chunk is one object with its own header, index and per-layer payloads, and a prompt is matched
# chunk by chunk: 256 tokens keep those costs near 1 % of the codec's bytes and a restore's
# per-object work small (docs/vllm.md, "Chunk size"), while a prompt that diverges recomputes at
# most 255 tokens more than a finer chunk would. vLLM's block size itself (16 on GPUs) is never
# the default: a 16-token object pays more in headers than in codes.
DEFAULT_CHUNK_TOKENS = 256


# Where a chunk's payloads start: packed at 64 bytes (format version 9) instead of each on a
# 4 KiB page. A chunk is read whole, so page-aligned payloads buy it nothing, and at 256 tokens
# of a 2-KV-head model the pages cost about 10 % of its bytes (docs/format.md §5).
CHUNK_ALIGNMENT = 64


def default_chunk_tokens(block_size: int) -> int:
    """DEFAULT_CHUNK_TOKENS rounded up to a multiple of ``block_size``."""
    return -(-DEFAULT_CHUNK_TOKENS // block_size) * block_size


class Stats:
    """Counters of one connector (scheduler or worker side); logged, and read by tests."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.c: Dict[str, float] = {k: 0 for k in (
            "lookups", "hit_tokens", "miss_lookups", "errors", "chunks_loaded", "bytes_read",
            "restore_seconds", "chunks_saved", "bytes_written", "save_seconds", "load_failures",
            "save_waits", "save_wait_seconds")}

    def add(self, **kw: float) -> None:
        with self.lock:
            for k, v in kw.items():
                self.c[k] = self.c.get(k, 0) + v

    def snapshot(self) -> Dict[str, float]:
        with self.lock:
            return dict(self.c)


def parse_config(extra: Dict[str, Any], block_size: int) -> Dict[str, Any]:
    """Checks kv_connector_extra_config; returns the connector's settings. Only codec and key
    means present are passed on to the library, so absent ones take its defaults."""
    known = {"store", "codec", "exact_tokens", "key_means", "chunk_tokens", "read_only",
             "namespace", "async_save", "save_queue"}
    unknown = set(extra) - known
    if unknown:
        raise ValueError(f"tqkv connector: unknown kv_connector_extra_config keys {sorted(unknown)}"
                         f" (known: {sorted(known)})")
    if not extra.get("store"):
        raise ValueError("tqkv connector: kv_connector_extra_config needs 'store' (a tqkv store URI)")
    chunk = int(extra.get("chunk_tokens", default_chunk_tokens(block_size)))
    if chunk <= 0 or chunk % block_size:
        raise ValueError(f"tqkv connector: chunk_tokens {chunk} is not a positive multiple of "
                         f"the block size {block_size}")
    ns = str(extra.get("namespace", "default"))
    if not _NAME_RE.match(ns):
        raise ValueError(f"tqkv connector: namespace {ns!r}: use 1-64 of [A-Za-z0-9._-]")
    save_kwargs: Dict[str, Any] = {}
    for k in ("codec", "key_means"):
        if k in extra:
            save_kwargs[k] = str(extra[k])
    if "exact_tokens" in extra:
        first, last = extra["exact_tokens"]
        if int(last) != 0:
            raise ValueError(f"tqkv connector: exact_tokens {extra['exact_tokens']!r}: the last "
                             "value must be 0 (a prompt's last tokens change every turn, so no "
                             "chunk stores an exact tail); the first applies to the prompt's "
                             "first chunk")
        save_kwargs["exact_head"] = int(first)
    async_save = extra.get("async_save", True)
    if not isinstance(async_save, bool):
        raise ValueError(f"tqkv connector: async_save {async_save!r} is not true or false")
    queue = extra.get("save_queue", 64)
    if isinstance(queue, bool) or not isinstance(queue, int) or queue < 1:
        raise ValueError(f"tqkv connector: save_queue {queue!r} is not a whole number >= 1 "
                         "(chunks waiting to be written)")
    return {"store": str(extra["store"]), "chunk_tokens": chunk, "namespace": ns,
            "read_only": bool(extra.get("read_only", False)), "save_kwargs": save_kwargs,
            "async_save": async_save, "save_queue": queue}


def model_identity(vllm_config: Any) -> Tuple[str, Dict[str, Any]]:
    """What the KV depends on besides the tokens: the model (name, revision, config), the KV
    geometry and dtype. Returns (identity string, geometry)."""
    mc, pc, cc = vllm_config.model_config, vllm_config.parallel_config, vllm_config.cache_config
    cfg = mc.hf_config.to_json_string(use_diff=False) if hasattr(mc.hf_config, "to_json_string") \
        else repr(mc.hf_config)
    kv_dtype = str(mc.dtype) if cc.cache_dtype in (None, "auto") else str(cc.cache_dtype)
    geo = {"layers": mc.get_num_layers(pc), "kv_heads": mc.get_num_kv_heads(pc),
           "head_dim": mc.get_head_size(), "dtype": kv_dtype.replace("torch.", ""),
           "tp": pc.tensor_parallel_size, "pp": pc.pipeline_parallel_size}
    digest = hashlib.blake2b(cfg.encode(), digest_size=8).hexdigest()
    ident = (f"{mc.model}@{mc.revision or ''} cfg={digest} L={geo['layers']} "
             f"H={geo['kv_heads']} D={geo['head_dim']} {geo['dtype']} tp={geo['tp']}")
    return ident, geo

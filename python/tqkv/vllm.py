"""tqkv inside vLLM: a KV connector that saves prompt KV compressed to any tqkv store and restores
it for returning users (docs/vllm.md).

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "TqkvConnector",
        "kv_connector_module_path": "tqkv.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"store": "/var/kv", "codec": "tq4"}}'   # codec: default tq3

Storage unit: a chain of chunks. Chunk i of a prompt holds tokens [i*C, (i+1)*C) (C = chunk_tokens, a
multiple of vLLM's block size) and is one tqkv session whose key is a hash of (namespace, model
identity, the parent chunk's hash, the chunk's token ids): a prompt that extends a stored one (the next
turn of a conversation, a shared system prompt) finds the stored chunks and only new chunks are written.
The header's model string records the model identity and the chunk hash; a different string, other
geometry, a corrupt or missing object or a store error is a miss and vLLM computes the tokens itself.

Importing this module does not import vLLM; the connector class is built on first use.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from typing import Any, Dict, List, Tuple

logger = logging.getLogger("tqkv.vllm")

# In every chunk's hash and model string; bump when the chunk contents change. /2 (2026-12-03):
# K and V of vLLM's CPU cache as its kernels lay them out (/1 stored them mixed).
_FORMAT = "tqkv-vllm/2"
_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


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
    """Checks kv_connector_extra_config; returns the connector's settings. Only keys present are
    passed on to tqkv.checkpoint, so absent ones take the library's defaults."""
    known = {"store", "codec", "exact_tokens", "key_means", "chunk_tokens", "read_only",
             "namespace", "link_gbps", "async_save", "save_queue"}
    unknown = set(extra) - known
    if unknown:
        raise ValueError(f"tqkv connector: unknown kv_connector_extra_config keys {sorted(unknown)}"
                         f" (known: {sorted(known)})")
    if not extra.get("store"):
        raise ValueError("tqkv connector: kv_connector_extra_config needs 'store' (a tqkv store URI)")
    chunk = int(extra.get("chunk_tokens", block_size))
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
        save_kwargs["exact_tokens"] = (int(first), int(last))
    try:
        link = float(extra.get("link_gbps", 0))
    except (TypeError, ValueError):
        link = -1.0
    if not 0 <= link < float("inf"):  # also refuses NaN
        raise ValueError(f"tqkv connector: link_gbps {extra['link_gbps']!r} is not a number >= 0"
                         " (GB/s; 0: no emulated link)")
    async_save = extra.get("async_save", True)
    if not isinstance(async_save, bool):
        raise ValueError(f"tqkv connector: async_save {async_save!r} is not true or false")
    queue = extra.get("save_queue", 64)
    if isinstance(queue, bool) or not isinstance(queue, int) or queue < 1:
        raise ValueError(f"tqkv connector: save_queue {queue!r} is not a whole number >= 1 "
                         "(chunks waiting to be written)")
    return {"store": str(extra["store"]), "chunk_tokens": chunk, "namespace": ns,
            "read_only": bool(extra.get("read_only", False)), "save_kwargs": save_kwargs,
            "link_gbps": link, "async_save": async_save, "save_queue": queue}


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


def chunk_hashes(namespace: str, ident: str, tokens: List[int], chunk: int) -> List[str]:
    """The chained hashes of the full chunks of ``tokens``: chunk i's hash covers the namespace,
    the model identity, chunk i-1's hash and chunk i's token ids."""
    out: List[str] = []
    parent = ""
    for i in range(len(tokens) // chunk):
        h = hashlib.blake2b(digest_size=20)
        h.update(f"{_FORMAT}\0{namespace}\0{ident}\0{parent}\0".encode())
        h.update(json.dumps(tokens[i * chunk:(i + 1) * chunk]).encode())
        parent = h.hexdigest()
        out.append(parent)
    return out


def chunk_key(namespace: str, h: str, rank: int = 0) -> str:
    return f"vllm/{namespace}/{h[:2]}/{h}" + (f".r{rank}" if rank else "")


def chunk_model(ident: str, h: str) -> str:
    """The model string stored in a chunk's header (at most 256 bytes, docs/format.md §4): the
    format, the model's name, a hash of the full identity and the chunk's hash."""
    name = ident.split("@", 1)[0].rstrip("/").rsplit("/", 1)[-1][:80]
    digest = hashlib.blake2b(ident.encode(), digest_size=8).hexdigest()
    return f"{_FORMAT} {name} id={digest} chunk={h}"


_CLASS: Any = None


def _build_class() -> Any:
    from ._vllm_connector import TqkvConnector  # imports vLLM

    return TqkvConnector


def __getattr__(name: str) -> Any:  # PEP 562: vLLM is imported only when the class is used
    global _CLASS
    if name == "TqkvConnector":
        if _CLASS is None:
            _CLASS = _build_class()
        return _CLASS
    raise AttributeError(name)

"""tqkv inside vLLM: a KV connector that saves prompt KV compressed to any tqkv store and restores
it for returning users (docs/vllm.md).

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "TqkvConnector",
        "kv_connector_module_path": "tqkv.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"store": "/var/kv", "codec": "tq4"}}'   # codec: default tq3

The package keeps only vLLM's glue; the library restores and saves a request's chunks in one
batched call each (tqkv.restore_batch, tqkv.checkpoint_batch):

    config     kv_connector_extra_config, the model identity, the connector's counters
    keys       the chained chunk hashes, store keys and header model strings
    scheduler  lookups (headers only) and the per-step load and save lists
    worker     the KV cache as the library sees it; the batched restore with per-layer readiness
    writer     the background writer of saves
    connector  the KVConnectorBase_V1 class
    tier       TqkvTier, a SecondaryTierManager for vLLM's own offloading (OffloadingConnector)
    offload_layout  vLLM's CPU offload rows as the library sees them, a tier chunk's identity

Only connector and tier import vLLM.

Importing this package does not import vLLM; the connector class is built on first use.
"""
from __future__ import annotations

from typing import Any

from .config import DEFAULT_CHUNK_TOKENS, Stats, default_chunk_tokens, model_identity, parse_config
from .keys import FORMAT, chunk_hashes, chunk_key, chunk_model

__all__ = ["TqkvConnector", "TqkvTier", "DEFAULT_CHUNK_TOKENS", "Stats", "default_chunk_tokens",
           "model_identity", "parse_config", "FORMAT", "chunk_hashes", "chunk_key", "chunk_model"]


def __getattr__(name: str) -> Any:  # PEP 562: vLLM is imported only when the class is used
    if name == "TqkvConnector":
        from .connector import TqkvConnector

        return TqkvConnector
    if name == "TqkvTier":
        from .tier import TqkvTier

        return TqkvTier
    raise AttributeError(name)

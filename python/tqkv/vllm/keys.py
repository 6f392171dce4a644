"""How the connector names what it stores (docs/format.md §14): a prompt's chunks as a chain of
hashes, each chunk's store key and the model string in its header."""
from __future__ import annotations

import hashlib
import json
from typing import List

# In every chunk's hash and model string; bump when the chunk contents change.
# /3 (2026-12-06): no exact tail per chunk, exact leading tokens only in the first chunk, payloads
# packed (format version 9). /2: K and V of vLLM's CPU cache as its kernels lay them out.
FORMAT = "tqkv-vllm/3"


def chunk_hashes(namespace: str, ident: str, tokens: List[int], chunk: int) -> List[str]:
    """The chained hashes of the full chunks of ``tokens``: chunk i's hash covers the namespace,
    the model identity, chunk i-1's hash and chunk i's token ids."""
    out: List[str] = []
    parent = ""
    for i in range(len(tokens) // chunk):
        h = hashlib.blake2b(digest_size=20)
        h.update(f"{FORMAT}\0{namespace}\0{ident}\0{parent}\0".encode())
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
    return f"{FORMAT} {name} id={digest} chunk={h}"

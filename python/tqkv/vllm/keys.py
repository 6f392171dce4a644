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


def _link(namespace: str, ident: str, parent: str, tokens: List[int]) -> str:
    h = hashlib.blake2b(digest_size=20)
    h.update(f"{FORMAT}\0{namespace}\0{ident}\0{parent}\0".encode())
    h.update(json.dumps(tokens).encode())
    return h.hexdigest()


def chunk_hashes(namespace: str, ident: str, tokens: List[int], chunk: int) -> List[str]:
    """The chained hashes of the full chunks of ``tokens``: chunk i's hash covers the namespace,
    the model identity, chunk i-1's hash and chunk i's token ids."""
    out: List[str] = []
    for i in range(len(tokens) // chunk):
        parent = out[-1] if out else ""
        out.append(_link(namespace, ident, parent, tokens[i * chunk:(i + 1) * chunk]))
    return out


def tail_hash(namespace: str, ident: str, parent: str, tokens: List[int]) -> str:
    """The hash of a prompt's last object (fewer tokens than a chunk), chained as a chunk's is
    onto ``parent``, the hash of the full chunk before it ("" when there is none)."""
    return _link(namespace, ident, parent, tokens)


def tail_key(namespace: str, ident: str, parent: str) -> str:
    """Where the last object after the full chunk ``parent`` is kept. Its length is not in the
    key (a lookup cannot know it): the header says it, and the header's model string holds the
    object's tail_hash, which the lookup checks against the request's tokens."""
    a = hashlib.blake2b(f"{FORMAT}\0{namespace}\0{ident}\0{parent}\0tail".encode(),
                        digest_size=20).hexdigest()
    return f"vllm/{namespace}/{a[:2]}/{a}.tail"


def chunk_key(namespace: str, h: str, rank: int = 0) -> str:
    return f"vllm/{namespace}/{h[:2]}/{h}" + (f".r{rank}" if rank else "")


def chunk_model(ident: str, h: str) -> str:
    """The model string stored in a chunk's header (at most 256 bytes, docs/format.md §4): the
    format, the model's name, a hash of the full identity and the chunk's hash."""
    name = ident.split("@", 1)[0].rstrip("/").rsplit("/", 1)[-1][:80]
    digest = hashlib.blake2b(ident.encode(), digest_size=8).hexdigest()
    return f"{FORMAT} {name} id={digest} chunk={h}"

"""llama.cpp sessions through tqkv: save a llama_cpp.Llama context's sequence to a store with a
codec, and load it into a (fresh) context, in two calls (docs/llama.md).

    import llama_cpp, tqkv.llama
    llm = llama_cpp.Llama(model_path, n_ctx=4096)
    llm.eval(tokens)
    tqkv.llama.save_sequence(llm, "/var/tqkv", "chat-42", codec="tq4")
    ...
    fresh = llama_cpp.Llama(model_path, n_ctx=4096)
    tqkv.llama.load_sequence(fresh, "/var/tqkv", "chat-42")

The sequence state blob (llama_state_seq_get_data) is read and rebuilt by the library's llama.cpp
reader (include/tqkv/llama_state.h) in this process: no ``tqkv`` command, no temporary files.
With codec "fp16" the blob that comes back is the original, byte for byte. Settings left ``None``
take the library's defaults, as in ``tqkv.checkpoint`` and ``tqkv llama import``. Failures raise
tqkv.Error subclasses (InvalidArgumentError, CorruptionError, UnsupportedError, ...).

Only the functions that take a ``Llama`` need llama-cpp-python; the blob functions work without it.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from . import _errors, _tqkv
from ._session import settings as _settings
from ._store import StoreLike, as_store

__all__ = [
    "get_sequence_state",
    "set_sequence_state",
    "head_dim_of",
    "save_sequence",
    "load_sequence",
    "save_blob",
    "load_blob",
    "load_blob_and_tokens",
    "split_slot_file",
    "join_slot_file",
]


def _llama_cpp() -> Any:
    import llama_cpp  # only the Llama-facing functions need it
    return llama_cpp


def _ctx(llm: Any) -> Any:
    return llm._ctx.ctx  # llama_cpp.llama_context_p of the high-level wrapper


def get_sequence_state(llm: Any, seq_id: int = 0) -> bytes:
    """The sequence's state blob, as llama_state_seq_get_data writes it."""
    lc = _llama_cpp()
    ctx = _ctx(llm)
    size = lc.llama_state_seq_get_size(ctx, seq_id)
    buf = (ctypes.c_uint8 * size)()
    written = lc.llama_state_seq_get_data(ctx, buf, size, seq_id)
    if written != size:
        raise _tqkv.InternalError(f"llama_state_seq_get_data wrote {written} of {size} bytes")
    return bytes(buf)


def set_sequence_state(llm: Any, blob: bytes, seq_id: int = 0) -> None:
    """Loads a blob into the sequence (llama_state_seq_set_data); InvalidArgumentError when
    llama.cpp refuses it (another model or context size, a sequence already in use)."""
    lc = _llama_cpp()
    ctx = _ctx(llm)
    buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
    read = lc.llama_state_seq_set_data(ctx, buf, len(blob), seq_id)
    if read != len(blob):
        raise _tqkv.InvalidArgumentError(
            f"llama_state_seq_set_data accepted {read} of {len(blob)} bytes: the context does "
            "not take this state (another model, a smaller n_ctx or a busy sequence)")


def head_dim_of(llm: Any) -> int:
    """The K/V head dimension: `<arch>.attention.key_length` when the GGUF has it (Gemma 3:
    256, not n_embd / n_head), else n_embd / n_head."""
    meta = llm.metadata
    arch = meta.get("general.architecture", "")
    if f"{arch}.attention.key_length" in meta:
        return int(meta[f"{arch}.attention.key_length"])
    lc = _llama_cpp()
    model = llm._model.model
    return lc.llama_model_n_embd(model) // lc.llama_model_n_head(model)


def save_blob(blob: bytes, store: StoreLike, key: str, head_dim: int,
              tokens: Optional[Sequence[int]] = None, *, codec: Optional[str] = None,
              layer_codecs: Optional[Mapping[int, str]] = None,
              exact_tokens: Optional[Tuple[int, int]] = None, key_means: Optional[str] = None,
              strict: Optional[bool] = None, guard: Optional[bool] = None,
              alignment: Optional[int] = None, model: str = "llama.cpp") -> Dict[str, Any]:
    """Stores a sequence state blob (with a slot file's tokens when given) as session ``key`` of
    ``store`` (a Store, a directory or any store URI, docs/store.md). The settings are
    tqkv.checkpoint's, with the same defaults. Returns tqkv.checkpoint's figures plus
    ``state_bytes`` (the blob's size)."""
    s = _settings(codec=codec, layer_codecs=layer_codecs, exact_tokens=exact_tokens,
                  key_means=key_means, strict=strict, guard=guard, alignment=alignment)
    toks = None if tokens is None else [int(t) for t in tokens]
    return _tqkv.llama_save(as_store(store)._s, key, bytes(blob), int(head_dim), model, toks, s)


def load_blob_and_tokens(store: StoreLike, key: str) -> Tuple[bytes, List[int]]:
    """(blob, tokens) of session ``key``; tokens is [] when the session came from a bare blob."""
    blob, tokens = _tqkv.llama_load(as_store(store, create=False)._s, key)
    return blob, list(tokens or [])


def load_blob(store: StoreLike, key: str) -> bytes:
    """The sequence state blob rebuilt from session ``key``."""
    return load_blob_and_tokens(store, key)[0]


def split_slot_file(data: bytes) -> Tuple[Optional[List[int]], bytes]:
    """(tokens, state) of a llama-server slot file ('ggsq'), or (None, data) for a bare blob."""
    tokens, state = _tqkv.llama_split_slot_file(bytes(data))
    return (None if tokens is None else list(tokens)), state


def join_slot_file(tokens: Sequence[int], state: bytes) -> bytes:
    """The slot file llama_state_seq_save_file would write for these tokens and state."""
    return _tqkv.llama_join_slot_file([int(t) for t in tokens], bytes(state))


def save_sequence(llm: Any, store: StoreLike, key: str, seq_id: int = 0,
                  **settings: Any) -> Dict[str, Any]:
    """Compresses the context's sequence ``seq_id`` into session ``key`` of ``store``, with the
    tokens the Llama object evaluated (sequence 0). ``settings``: save_blob's keyword arguments
    (codec, layer_codecs, exact_tokens, key_means, strict, guard). Returns save_blob's figures
    (``state_bytes``: the size of llama.cpp's own state blob)."""
    blob = get_sequence_state(llm, seq_id)
    tokens = [int(t) for t in llm.input_ids[: llm.n_tokens]] if seq_id == 0 else None
    settings.setdefault("model", os.path.basename(llm.model_path))
    return save_blob(blob, store, key, head_dim_of(llm), tokens, **settings)


def load_sequence(llm: Any, store: StoreLike, key: str, seq_id: int = 0) -> List[int]:
    """Loads session ``key`` into the context's sequence ``seq_id`` (which should be empty). For
    sequence 0 the Llama object's token history is set too, so llm.eval / create_completion
    continue after it. Returns the session's tokens (empty when it has none)."""
    blob, tokens = load_blob_and_tokens(store, key)
    set_sequence_state(llm, blob, seq_id)
    if seq_id == 0 and tokens:
        llm.input_ids[: len(tokens)] = tokens
        llm.n_tokens = len(tokens)
    return tokens


_errors.public(globals(), __all__)

"""llama.cpp sessions through tqkv: save a llama_cpp.Llama context's sequence to a store with a
codec, and load it into a (fresh) context, in two calls (docs/llama.md).

    import llama_cpp, tqkv.llama
    llm = llama_cpp.Llama(model_path, n_ctx=4096)
    llm.eval(tokens)
    tqkv.llama.save_sequence(llm, "/var/tqkv", "chat-42", codec="tq4")
    ...
    fresh = llama_cpp.Llama(model_path, n_ctx=4096)
    tqkv.llama.load_sequence(fresh, "/var/tqkv", "chat-42")

The sequence state blob (llama_state_seq_get_data) is compressed by the library's llama.cpp
reader (include/tqkv/llama_state.h) through the `tqkv llama import|export` commands; the binary is
found through $TQKV_CLI, then `tqkv` on PATH. With codec "fp16" the blob that comes back is the
original, byte for byte.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
from typing import Optional, Sequence

import llama_cpp

__all__ = [
    "cli_path",
    "get_sequence_state",
    "set_sequence_state",
    "head_dim_of",
    "save_sequence",
    "load_sequence",
    "save_blob",
    "load_blob",
    "load_blob_and_tokens",
]


def cli_path() -> str:
    """The tqkv executable: $TQKV_CLI, else `tqkv` on PATH."""
    path = os.environ.get("TQKV_CLI") or shutil.which("tqkv")
    if not path or not os.access(path, os.X_OK):
        raise FileNotFoundError("tqkv executable not found: set TQKV_CLI or put tqkv on PATH")
    return path


def _ctx(llm: "llama_cpp.Llama"):
    return llm._ctx.ctx  # llama_cpp.llama_context_p of the high-level wrapper


def get_sequence_state(llm: "llama_cpp.Llama", seq_id: int = 0) -> bytes:
    """The sequence's state blob, as llama_state_seq_get_data writes it."""
    ctx = _ctx(llm)
    size = llama_cpp.llama_state_seq_get_size(ctx, seq_id)
    buf = (ctypes.c_uint8 * size)()
    written = llama_cpp.llama_state_seq_get_data(ctx, buf, size, seq_id)
    if written != size:
        raise RuntimeError(f"llama_state_seq_get_data wrote {written} of {size} bytes")
    return bytes(buf)


def set_sequence_state(llm: "llama_cpp.Llama", blob: bytes, seq_id: int = 0) -> None:
    """Loads a blob into the sequence (llama_state_seq_set_data); raises when llama.cpp refuses."""
    ctx = _ctx(llm)
    buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
    read = llama_cpp.llama_state_seq_set_data(ctx, buf, len(blob), seq_id)
    if read != len(blob):
        raise RuntimeError(f"llama_state_seq_set_data accepted {read} of {len(blob)} bytes")


def head_dim_of(llm: "llama_cpp.Llama") -> int:
    """The K/V head dimension: `<arch>.attention.key_length` when the GGUF has it (Gemma 3:
    256, not n_embd / n_head), else n_embd / n_head."""
    meta = llm.metadata
    arch = meta.get("general.architecture", "")
    if f"{arch}.attention.key_length" in meta:
        return int(meta[f"{arch}.attention.key_length"])
    model = llm._model.model
    return llama_cpp.llama_model_n_embd(model) // llama_cpp.llama_model_n_head(model)


def _run(args: Sequence[str]) -> str:
    proc = subprocess.run([cli_path(), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip() or f"tqkv {' '.join(args)} failed")
    return proc.stdout


def save_blob(blob: bytes, store: str, key: str, head_dim: int, codec: str = "tq3",
              tokens: Optional[Sequence[int]] = None, exact_tokens: Optional[str] = None,
              model: str = "llama.cpp", threads: int = 0, key_means: Optional[str] = None) -> None:
    """Stores a sequence state blob (with a slot file's tokens when given) as session `key`.
    key_means: `tqkv llama import --key-means` (off, session or a block B[,f16|f32]); None keeps
    the default (128-token blocks)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "state.bin")
        with open(path, "wb") as f:
            if tokens is not None:
                import struct
                f.write(struct.pack("<III", 0x67677371, 3, len(tokens)))
                f.write(struct.pack(f"<{len(tokens)}i", *tokens))
            f.write(blob)
        args = ["llama", "import", path, "--store", store, "--session", key, "--codec", codec,
                "--head-dim", str(head_dim), "--model", model, "--threads", str(threads)]
        if exact_tokens:
            args += ["--exact-tokens", exact_tokens]
        if key_means:
            args += ["--key-means", key_means]
        _run(args)


def load_blob(store: str, key: str, threads: int = 0) -> bytes:
    """The sequence state blob rebuilt from session `key`."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "state.bin")
        _run(["llama", "export", "--store", store, "--session", key, "--out", path, "--blob",
              "--threads", str(threads)])
        with open(path, "rb") as f:
            return f.read()


def save_sequence(llm: "llama_cpp.Llama", store: str, key: str, codec: str = "tq3",
                  seq_id: int = 0, exact_tokens: Optional[str] = None,
                  key_means: Optional[str] = None) -> int:
    """Compresses the context's sequence `seq_id` into session `key` of `store` (a directory or
    any store URI, docs/store.md), with the tokens the Llama object evaluated (sequence 0).
    key_means as in save_blob. Returns the size of llama.cpp's own state blob in bytes."""
    blob = get_sequence_state(llm, seq_id)
    tokens = [int(t) for t in llm.input_ids[: llm.n_tokens]] if seq_id == 0 else None
    save_blob(blob, store, key, head_dim_of(llm), codec=codec, tokens=tokens,
              exact_tokens=exact_tokens, model=os.path.basename(llm.model_path),
              threads=llm.context_params.n_threads, key_means=key_means)
    return len(blob)


def load_sequence(llm: "llama_cpp.Llama", store: str, key: str, seq_id: int = 0) -> list:
    """Loads session `key` into the context's sequence `seq_id` (which should be empty). For
    sequence 0 the Llama object's token history is set too, so llm.eval / create_completion
    continue after it. Returns the session's tokens (empty when it has none)."""
    blob, tokens = load_blob_and_tokens(store, key, threads=llm.context_params.n_threads)
    set_sequence_state(llm, blob, seq_id)
    if seq_id == 0 and tokens:
        llm.input_ids[: len(tokens)] = tokens
        llm.n_tokens = len(tokens)
    return tokens


def load_blob_and_tokens(store: str, key: str, threads: int = 0):
    """(blob, tokens) of session `key`; tokens is [] when the session came from a bare blob."""
    import struct
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "state.bin")
        _run(["llama", "export", "--store", store, "--session", key, "--out", path,
              "--threads", str(threads)])
        with open(path, "rb") as f:
            data = f.read()
    if len(data) >= 12 and struct.unpack_from("<I", data)[0] == 0x67677371:
        n = struct.unpack_from("<I", data, 8)[0]
        return data[12 + 4 * n:], list(struct.unpack_from(f"<{n}i", data, 12))
    return data, []

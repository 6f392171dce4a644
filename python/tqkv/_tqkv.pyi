"""
tqkv's C++ core; use the tqkv package (tqkv/__init__.py), not this module.
"""

from collections.abc import Sequence
from typing import Annotated

import numpy
from numpy.typing import NDArray

from tqkv import (
    AlreadyExistsError as AlreadyExistsError,
    BusyError as BusyError,
    CorruptionError as CorruptionError,
    DeviceError as DeviceError,
    Error as Error,
    InternalError as InternalError,
    InvalidArgumentError as InvalidArgumentError,
    IoError as IoError,
    NoSpaceError as NoSpaceError,
    NotFoundError as NotFoundError,
    ResourceExhaustedError as ResourceExhaustedError,
    UnsupportedError as UnsupportedError
)


def set_num_threads(n: int) -> None:
    """
    Sizes the pool that encodes and decodes (0: one thread per hardware thread, the default). Calls already running keep their pool.
    """

def warm_restore_memory(concurrent: int = 1, read_ahead: int = 67108864) -> int:
    """
    Allocates, touches and keeps the read-ahead memory of `concurrent` restores (at most 2 GiB kept in all), so that the first restores do not pay for fresh memory. Returns the bytes kept.
    """

def get_num_threads() -> int:
    """
    Threads that encode and decode for each call (the calling thread included).
    """

def built_with_cuda() -> bool:
    """
    True when the package was built with the CUDA library (TQKV_ENABLE_CUDA).
    """

NO_CUDA_MESSAGE: str = ...

class Codec:
    def __init__(self, spec: str, head_dim: int) -> None: ...

    @property
    def spec(self) -> str: ...

    @property
    def label(self) -> str: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def code_bytes(self) -> int: ...

    @property
    def meta_bytes(self) -> int: ...

    def bits_per_value(self, vectors_per_group: int) -> float: ...

    def select_meta(self, x: Annotated[NDArray, dict(device='cpu', writable=False)], meta: Annotated[NDArray, dict(device='cpu')]) -> None: ...

    def encode(self, x: Annotated[NDArray, dict(device='cpu', writable=False)], out: Annotated[NDArray, dict(device='cpu')], meta: Annotated[NDArray, dict(device='cpu', writable=False)] | None) -> None: ...

    def decode(self, codes: Annotated[NDArray, dict(device='cpu', writable=False)], out: Annotated[NDArray, dict(device='cpu')], meta: Annotated[NDArray, dict(device='cpu', writable=False)] | None) -> None: ...

class Store:
    @property
    def uri(self) -> str: ...

    @property
    def name(self) -> str: ...

    def sessions(self, prefix: str) -> list: ...

    def size(self, key: str) -> int: ...

    def exists(self, key: str) -> bool: ...

    def remove(self, key: str) -> None: ...

    def set_pin(self, key: str, until_ns: int) -> None: ...

    def gc(self, max_bytes: int, ttl_s: int, temp_age_s: int, dry_run: bool) -> dict: ...

    def describe_json(self, key: str, chunks: bool) -> str: ...

    def verify(self, key: str) -> None: ...

def open_store(uri: str, create: bool) -> Store: ...

PIN_FOREVER: int = -1

class Axes:
    def __init__(self) -> None: ...

    @property
    def token(self) -> int: ...

    @token.setter
    def token(self, arg: int, /) -> None: ...

    @property
    def head(self) -> int: ...

    @head.setter
    def head(self, arg: int, /) -> None: ...

    @property
    def dim(self) -> int: ...

    @dim.setter
    def dim(self, arg: int, /) -> None: ...

    @property
    def block(self) -> int: ...

    @block.setter
    def block(self, arg: int, /) -> None: ...

class CheckpointSettings:
    pass

def checkpoint_settings(codec: str | None, layer_codecs: Sequence[str], exact_tokens: str | None, key_means: str | None, strict: bool | None, guard: bool | None, alignment: int | None) -> CheckpointSettings: ...

def resolve_settings(settings: CheckpointSettings) -> dict: ...

def checkpoint(store: Store, key: str, k: Sequence[Annotated[NDArray, dict(device='cpu', writable=False)]], v: Sequence[Annotated[NDArray, dict(device='cpu', writable=False)]], axes: Axes, block_ids: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)] | None, tokens: int, settings: CheckpointSettings, model: str, token_block: int) -> dict: ...

def restore_into(store: Store, key: str, k: Sequence[NDArray], v: Sequence[NDArray], axes: Axes, block_ids: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)] | None, tokens: int, layer_ready: object | None, drop_cache: bool, inflight_bytes: int) -> dict: ...

def header(store: Store, key: str) -> dict: ...

class PagedArrays:
    @property
    def tokens(self) -> int: ...

    @property
    def staged(self) -> bool: ...

    @property
    def layers(self) -> int: ...

def paged_arrays(k: Sequence[NDArray], v: Sequence[NDArray], axes: Axes, tokens: int) -> PagedArrays: ...

def vllm_cpu_arrays(layers: Sequence[NDArray], isa: str, kv_heads: int, head_dim: int, tokens: int) -> PagedArrays: ...

def restore_batch(store: Store, keys: Sequence[str], models: Sequence[str], block_ids: Sequence[Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]], tokens: Sequence[int], dst: PagedArrays, layer_ready: object | None, drop_cache: bool, in_flight: int) -> dict: ...

def checkpoint_batch(store: Store, keys: Sequence[str], models: Sequence[str], block_ids: Sequence[Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]], first_tokens: Sequence[int], tokens: Sequence[int], src: PagedArrays, settings: CheckpointSettings, token_block: int, in_flight: int, skip_existing: bool) -> dict: ...

def restore_new(store: Store, key: str, axes: Axes, allocate: object, layer_ready: object | None, drop_cache: bool, inflight_bytes: int) -> dict: ...

def llama_save(store: Store, key: str, state: bytes, head_dim: int, model: str, tokens: Sequence[int] | None, settings: CheckpointSettings) -> dict: ...

def llama_load(store: Store, key: str) -> tuple: ...

def llama_split_slot_file(data: bytes) -> tuple: ...

def llama_join_slot_file(tokens: Sequence[int], state: bytes) -> bytes: ...

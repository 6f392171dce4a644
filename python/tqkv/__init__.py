"""tqkv: TurboQuant KV-cache compression, checkpoint and restore, from numpy and PyTorch.

    import tqkv
    store = tqkv.open_store("/tmp/kv")
    tqkv.checkpoint(store, "s1", k, v)   # k, v: [layers, tokens, kv_heads, head_dim]; default codec
    k2, v2 = tqkv.restore(store, "s1")

docs/python.md has the guide; help(tqkv.restore), help(tqkv.Codec), help(tqkv.Store) the details.
Every failure of a public call is a tqkv.Error subclass carrying the library's message (a bad
argument caught by Python itself too: InvalidArgumentError; _errors.py). The ``tqkv`` command installed
with the package is the same CLI as the C++ build's.
"""
from ._tqkv import (  # noqa: F401 - the public names
    AlreadyExistsError,
    BusyError,
    CorruptionError,
    DeviceError,
    Error,
    InternalError,
    InvalidArgumentError,
    IoError,
    NoSpaceError,
    NotFoundError,
    ResourceExhaustedError,
    UnsupportedError,
    get_num_threads,
    set_num_threads,
    warm_restore_memory,
)
from ._tqkv import built_with_cuda as _built_with_cuda
from . import _errors
from ._batch import PagedKV, checkpoint_batch, paged_kv, restore_batch, vllm_cpu_kv
from ._codec import Codec
from ._session import checkpoint, resolve_settings, restore, restore_layers
from ._store import Store, inspect, open_store, verify

__version__ = "0.1.0"
CUDA: bool = _built_with_cuda()  # the package was built with the CUDA library

__all__ = [
    "Codec", "Store", "open_store", "checkpoint", "resolve_settings", "restore", "restore_layers", "inspect",
    "PagedKV", "paged_kv", "vllm_cpu_kv", "restore_batch", "checkpoint_batch",
    "verify", "set_num_threads", "get_num_threads", "warm_restore_memory", "CUDA", "Error",
    "InvalidArgumentError",
    "NotFoundError", "CorruptionError", "IoError", "NoSpaceError", "UnsupportedError",
    "DeviceError", "BusyError", "AlreadyExistsError", "InternalError", "ResourceExhaustedError",
]

_errors.public(globals(), __all__)

"""tqkv.Store: a store URI opened once; sessions, pins, gc, inspect and verify on it."""
from __future__ import annotations

import json
import numbers
import os
import time
from typing import Any, Dict, List, Optional, Union

from . import _tqkv


# The CLI's bound on durations (tqkv/units.h ParseDuration): 100 years.
_MAX_SECONDS = 100 * 365.25 * 86400


def _seconds(name: str, value: Any, minimum: float) -> float:
    """A duration argument as the CLI takes it: a finite number of seconds in [minimum, 100 y]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
            not minimum <= value <= _MAX_SECONDS:
        raise _tqkv.InvalidArgumentError(
            f"{name}: seconds in [{minimum:g}, {_MAX_SECONDS:g}], got {value!r}")
    return float(value)


class Store:
    """A store opened by ``tqkv.open_store(uri)``: every URI the C++ library accepts
    (``/plain/dir``, ``file:///dir?io=direct``, ``nfs://host/export``, ``redis://host:6379``,
    ``redis+cluster://host:7000``, ``s3://bucket/prefix?endpoint=...``, ``memory://``;
    docs/store.md). Safe to share between threads.
    """

    def __init__(self, core: Any) -> None:
        self._s = core

    @property
    def uri(self) -> str:
        return self._s.uri

    @property
    def name(self) -> str:
        """The backend: 'posix', 'nfs', 'redis', 'memory', ..."""
        return self._s.name

    def ls(self, prefix: str = "") -> List[Dict[str, Any]]:
        """The committed sessions, sorted by key: dicts with ``key``, ``size`` (bytes),
        ``mtime_ns`` (publish), ``atime_ns`` (last restore, 0 unknown), ``pin_until_ns``
        (0 not pinned, -1 forever) — what ``tqkv ls --json`` lists."""
        return self._s.sessions(prefix)

    def exists(self, key: str) -> bool:
        return self._s.exists(key)

    def size(self, key: str) -> int:
        """Bytes of the stored session (NotFoundError if absent)."""
        return self._s.size(key)

    def rm(self, key: str) -> None:
        """Removes the session and its pin (NotFoundError if absent)."""
        self._s.remove(key)

    def pin(self, key: str, ttl: Optional[float] = None) -> None:
        """Pins the session so ``gc`` never evicts it: for ``ttl`` seconds, or until ``unpin``."""
        until = (_tqkv.PIN_FOREVER if ttl is None
                 else time.time_ns() + int(_seconds("ttl", ttl, 1) * 1e9))
        self._s.set_pin(key, until)

    def unpin(self, key: str) -> None:
        self._s.set_pin(key, 0)

    def gc(self, max_bytes: Optional[int] = None, ttl: Optional[float] = None,
           temp_age: float = 3600, dry_run: bool = False) -> Dict[str, Any]:
        """Evicts unpinned sessions unused for ``ttl`` seconds, then least recently used ones
        until the store holds at most ``max_bytes``; removes temps of writers dead for
        ``temp_age`` seconds. Returns the report of ``tqkv gc --json``."""
        if max_bytes is not None and (isinstance(max_bytes, bool) or
                                      not isinstance(max_bytes, numbers.Integral) or
                                      not 0 <= max_bytes < 2**64):
            raise _tqkv.InvalidArgumentError(f"max_bytes: an integer in [0, 2**64), got {max_bytes!r}")
        ttl_s = 0 if ttl is None else int(_seconds("ttl", ttl, 1))
        return self._s.gc(int(max_bytes or 0), ttl_s, int(_seconds("temp_age", temp_age, 0)),
                          dry_run)

    def inspect(self, key: str, chunks: bool = False) -> Dict[str, Any]:
        """The session's description, the same as ``tqkv inspect --json`` (a dict)."""
        return json.loads(self._s.describe_json(key, chunks))

    def verify(self, key: str) -> None:
        """Runs every check a restore runs (checksums, layout, outlier masks; decoding one layer
        at a time); raises CorruptionError naming what failed. OK means ``restore`` works."""
        self._s.verify(key)

    def header(self, key: str) -> Dict[str, Any]:
        """Model, geometry (layers, kv_heads, head_dim), tokens and source dtype of a session."""
        return _tqkv.header(self._s, key)

    def checkpoint(self, key: str, k: Any, v: Any, **options: Any) -> Dict[str, Any]:
        """``tqkv.checkpoint(self, key, k, v, **options)``."""
        from ._session import checkpoint

        return checkpoint(self, key, k, v, **options)

    def restore(self, key: str, **options: Any) -> Any:
        """``tqkv.restore(self, key, **options)``."""
        from ._session import restore

        return restore(self, key, **options)

    def restore_layers(self, key: str, **options: Any) -> Any:
        """``tqkv.restore_layers(self, key, **options)``."""
        from ._session import restore_layers

        return restore_layers(self, key, **options)

    def __repr__(self) -> str:
        return f"tqkv.Store({self.uri!r})"


def open_store(uri: str, create: bool = True) -> Store:
    """Opens a store by URI (docs/store.md). ``create=False`` never creates a directory, so a
    mistyped path is a NotFoundError rather than a new empty store."""
    return Store(_tqkv.open_store(os.fspath(uri), create))


StoreLike = Union[Store, str, "os.PathLike[str]"]


def as_store(store: StoreLike, create: bool = True) -> Store:
    return store if isinstance(store, Store) else open_store(os.fspath(store), create)


def _file(path: Union[str, "os.PathLike[str]"]) -> tuple:
    """A .tqkv file path as (store, key), as the tqkv command reads it."""
    path = os.path.abspath(os.fspath(path))
    name = os.path.basename(path)
    if not name.endswith(".tqkv"):
        raise _tqkv.InvalidArgumentError(f"{path}: not a .tqkv file name")
    return open_store(os.path.dirname(path), create=False), name[: -len(".tqkv")]


def inspect(path: Union[str, "os.PathLike[str]"], chunks: bool = False) -> Dict[str, Any]:
    """``tqkv inspect --json FILE`` of a .tqkv file, as a dict."""
    store, key = _file(path)
    return store.inspect(key, chunks)


def verify(path: Union[str, "os.PathLike[str]"]) -> None:
    """``tqkv verify FILE``: raises CorruptionError if any check a restore makes fails."""
    store, key = _file(path)
    store.verify(key)

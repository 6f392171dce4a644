"""Fixtures of the Python package's tests (run by scripts/test.sh; docs/python.md).

The package comes from PYTHONPATH (<build>/python in a plain CMake build with
-DTQKV_BUILD_PYTHON=ON) or from an installed wheel; the tqkv command from TQKV_CLI, <build>/tqkv
next to the package, or PATH.
"""
import os
import pathlib
import shutil
import urllib.parse

import numpy as np
import pytest

import tqkv

REPO = pathlib.Path(__file__).resolve().parents[2]


def _cli():
    env = os.environ.get("TQKV_CLI")
    if env:
        return env
    beside = pathlib.Path(tqkv.__file__).resolve().parents[2] / "tqkv"  # <build>/python/tqkv
    if beside.is_file():
        return str(beside)
    return shutil.which("tqkv")


@pytest.fixture(scope="session")
def cli():
    path = _cli()
    if path is None:
        pytest.skip("no tqkv command (set TQKV_CLI)")
    return path


@pytest.fixture
def store(tmp_path):
    return tqkv.open_store(str(tmp_path / "kv"))


def _throttle_uri(inner, read_rate=0, write_rate=0, per_object=False):
    return (f"throttle://?store={urllib.parse.quote(str(inner), safe='')}"
            f"&read_rate={round(read_rate)}&write_rate={round(write_rate)}"
            f"&per_object={int(per_object)}")


@pytest.fixture
def throttle_uri():
    """Builds the URI of the development module's throttle:// store (docs/store.md §5) around
    the store `inner`: rates in bytes per second, 0 unlimited. Skips on a module without the test
    schemes (an installed wheel); in a build tree that is a failure."""
    try:
        tqkv.open_store(_throttle_uri("memory://"))
    except tqkv.InvalidArgumentError as e:
        in_build_tree = (pathlib.Path(tqkv.__file__).resolve().parents[2] / "CMakeCache.txt")
        if in_build_tree.is_file():
            pytest.fail(f"the build tree's module has no throttle:// scheme: {e}")
        pytest.skip(f"no throttle:// in this module (a wheel: development builds only): {e}")
    return _throttle_uri


def session_arrays(layers=2, tokens=40, heads=2, dim=64, dtype=np.float32, seed=0):
    """A random cache [layers, tokens, heads, dim] for K and for V (V shifted, K scaled per
    channel, so the channels differ in energy as real keys do)."""
    rng = np.random.default_rng(seed)
    scale = np.linspace(0.2, 3.0, dim, dtype=np.float32)
    k = (rng.standard_normal((layers, tokens, heads, dim), dtype=np.float32) * scale)
    v = rng.standard_normal((layers, tokens, heads, dim), dtype=np.float32) + 0.5
    return k.astype(dtype), v.astype(dtype)


def read_safetensors(path):
    """{name: numpy array} of a safetensors file (the format is an 8-byte length, a JSON header
    and raw little-endian data; BF16 comes back as uint16 bit patterns)."""
    import json
    import struct

    data = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    types = {"F16": np.float16, "F32": np.float32, "BF16": np.uint16}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        out[name] = np.frombuffer(body[begin:end], dtype=types[t["dtype"]]).reshape(t["shape"])
    return out

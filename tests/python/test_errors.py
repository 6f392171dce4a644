"""Every exception type from a real fault: corrupt file, missing key, bad spec, wrong geometry."""
import numpy as np
import pytest

import tqkv
from conftest import session_arrays


def test_corrupt_file_is_a_corruption_error(store, tmp_path):
    k, v = session_arrays(dtype=np.float16)
    tqkv.checkpoint(store, "s", k, v)
    path = tmp_path / "kv" / "s.tqkv"
    data = bytearray(path.read_bytes())
    data[8192 + 5] ^= 0xFF  # inside the first chunk's payload
    path.write_bytes(bytes(data))
    with pytest.raises(tqkv.CorruptionError, match="s") as err:
        tqkv.restore(store, "s")
    assert isinstance(err.value, tqkv.Error) and err.value.code == "Corruption"
    with pytest.raises(tqkv.CorruptionError):
        tqkv.verify(path)
    path.write_bytes(b"not a container at all")
    with pytest.raises(tqkv.CorruptionError):
        store.inspect("s")


def test_missing_key_and_store_are_not_found(store, tmp_path):
    with pytest.raises(tqkv.NotFoundError):
        tqkv.restore(store, "nope")
    with pytest.raises(tqkv.NotFoundError):
        store.size("nope")
    with pytest.raises(tqkv.NotFoundError):
        tqkv.open_store(str(tmp_path / "missing"), create=False)


def test_bad_spec_key_and_uri_are_invalid_arguments(store):
    k, v = session_arrays(dtype=np.float16)
    with pytest.raises(tqkv.InvalidArgumentError, match="tq9"):
        tqkv.checkpoint(store, "s", k, v, codec="tq9")
    with pytest.raises(tqkv.InvalidArgumentError):
        tqkv.checkpoint(store, "../escape", k, v)
    with pytest.raises(tqkv.InvalidArgumentError):
        tqkv.open_store("file:///tmp/x?nonsense=1")
    with pytest.raises(tqkv.InvalidArgumentError):
        tqkv.checkpoint(store, "s", k, v[:1])  # V has fewer layers


def test_wrong_geometry_in_out_is_an_invalid_argument(store):
    k, v = session_arrays(layers=2, tokens=40, heads=2, dim=64, dtype=np.float16)
    tqkv.checkpoint(store, "s", k, v)
    for shape in ((2, 40, 2, 32), (2, 40, 1, 64), (3, 40, 2, 64), (2, 41, 2, 64)):
        ko = np.zeros(shape, np.float16)
        with pytest.raises(tqkv.InvalidArgumentError):
            tqkv.restore(store, "s", out=(ko, ko.copy()))
    ko = np.zeros((2, 41, 2, 64), np.float16)
    with pytest.raises(tqkv.InvalidArgumentError, match="41"):
        tqkv.restore(store, "s", out=(ko, ko.copy()))
    ro = np.zeros(k.shape, np.float16)
    ro.flags.writeable = False
    with pytest.raises((TypeError, tqkv.InvalidArgumentError)):
        tqkv.restore(store, "s", out=(ro, ro))

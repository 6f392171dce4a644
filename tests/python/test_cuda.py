"""CUDA arrays: a build without CUDA refuses them (and device="cuda") with InvalidArgumentError
saying so; the CUDA build with a device restores into torch CUDA tensors, equal to the CPU
restore, in the canonical, transposed and paged layouts (skipped without torch, CUDA or a GPU),
and without a device raises DeviceError."""
import ctypes
import os

import numpy as np
import pytest

import tqkv
from conftest import session_arrays


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class FakeCudaArray:
    """A float16 [8, 2, 64] DLPack tensor on CUDA device 0 (kDLCUDA) whose data pointer is
    never dereferenced: what a torch CUDA tensor looks like to the bindings, without a GPU."""
    shape = (8, 2, 64)

    def __init__(self):
        self._keep = []

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, **kwargs):
        shape = (ctypes.c_int64 * 3)(*self.shape)
        strides = (ctypes.c_int64 * 3)(128, 64, 1)
        m = _DLManagedTensor(data=0x10000, device=_DLDevice(2, 0), ndim=3,
                             dtype=_DLDataType(2, 16, 1), shape=shape, strides=strides)
        self._keep += [shape, strides, m]
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(m), b"dltensor", None)


@pytest.mark.skipif(tqkv.CUDA, reason="this build has CUDA")
def test_cpu_only_build_refuses_cuda_arrays(store):
    k, v = session_arrays(tokens=8, dtype=np.float16)
    tqkv.checkpoint(store, "s", k, v)
    fake = [FakeCudaArray(), FakeCudaArray()]
    with pytest.raises(tqkv.InvalidArgumentError, match="CUDA build"):
        tqkv.restore(store, "s", out=(fake, fake))
    with pytest.raises(tqkv.InvalidArgumentError, match="CUDA build"):
        tqkv.restore(store, "s", device="cuda", array="torch")
    with pytest.raises(tqkv.InvalidArgumentError, match="CPU first"):
        tqkv.checkpoint(store, "t", fake, fake)
    assert not store.exists("t")
    # The binding refuses them too (the package's own check bypassed).
    axes = tqkv._session._axes("nhd")
    with pytest.raises(tqkv.InvalidArgumentError, match="CUDA build"):
        tqkv._tqkv.restore_into(store._s, "s", fake, fake, axes, None, 0, None, False, 0)


def _cuda_torch():
    if not tqkv.CUDA:
        pytest.skip("built without CUDA")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


def test_cuda_restore_equals_the_cpu_restore(store):
    torch = _cuda_torch()
    k, v = session_arrays(layers=3, tokens=50, dtype=np.float16, seed=3)
    tqkv.checkpoint(store, "s", k, v, codec="tq3", key_means="16", exact_tokens=(3, 5))
    ck, cv = tqkv.restore(store, "s")
    stats = {}
    gk, gv = tqkv.restore(store, "s", device="cuda", array="torch", stats=stats)
    assert gk.is_cuda and stats["staged"] is False  # decoded straight into the tensors
    assert np.array_equal(gk.cpu().numpy(), ck) and np.array_equal(gv.cpu().numpy(), cv)
    # transposed, into the caller's CUDA tensors
    hk = torch.zeros((3, 2, 50, 64), dtype=torch.float16, device="cuda")
    hv = torch.zeros_like(hk)
    ptr = hk.data_ptr()
    tqkv.restore(store, "s", out=(hk, hv), layout="hnd")
    assert hk.data_ptr() == ptr
    assert np.array_equal(hk.cpu().numpy().transpose(0, 2, 1, 3), ck)
    # paged blocks, shuffled ids, partial last block
    ids = [5, 0, 3, 1]
    kp = torch.zeros((3, 6, 16, 2, 64), dtype=torch.float16, device="cuda")
    vp = torch.zeros_like(kp)
    tqkv.restore(store, "s", out=(kp, vp), layout="paged", block_ids=ids, tokens=50)
    host = kp.cpu().numpy()
    for i, b in enumerate(ids):
        n = min(16, 50 - i * 16)
        assert np.array_equal(host[:, b, :n], ck[:, i * 16:i * 16 + n])
    assert not host[:, 2].any() and not host[:, 4].any()


@pytest.mark.skipif(not tqkv.CUDA or os.path.exists("/dev/nvidia0"),
                    reason="needs the CUDA build on a machine without a GPU")
def test_cuda_build_without_a_device_raises_device_error(store):
    k, v = session_arrays(tokens=8, dtype=np.float16)
    tqkv.checkpoint(store, "s", k, v)
    fake = [FakeCudaArray(), FakeCudaArray()]
    with pytest.raises(tqkv.DeviceError, match="no CUDA device"):
        tqkv.restore(store, "s", out=(fake, fake))

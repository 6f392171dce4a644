"""Array plumbing shared by the codec and session modules: dtypes, numpy/torch, bfloat16 views.

Nothing here copies data: bfloat16 numpy arrays (ml_dtypes) are viewed as uint16, and outputs
are allocated once and handed to the C++ core to fill.
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

try:  # numpy has no bfloat16 of its own; ml_dtypes (optional) provides one
    import ml_dtypes as _ml_dtypes

    BFLOAT16: Any = _ml_dtypes.bfloat16
except ImportError:  # pragma: no cover - depends on the environment
    BFLOAT16 = None

_DTYPE_NAMES = {
    "float16": "float16", "f16": "float16", "fp16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float32": "float32", "f32": "float32", "fp32": "float32", "float": "float32",
}


def dtype_name(dtype: Any) -> str:
    """'float16', 'bfloat16' or 'float32' for a name, numpy dtype or torch dtype."""
    if isinstance(dtype, str):
        name = _DTYPE_NAMES.get(dtype.lower())
    else:
        text = str(dtype).replace("torch.", "")
        name = _DTYPE_NAMES.get(text) or _DTYPE_NAMES.get(getattr(dtype, "__name__", ""))
        if name is None:
            try:
                name = _DTYPE_NAMES.get(np.dtype(dtype).name)
            except TypeError:
                name = None
    if name is None:
        from . import _tqkv

        raise _tqkv.InvalidArgumentError(
            f"dtype {dtype!r}: use float16, bfloat16 or float32")
    return name


def is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "__dlpack__")


def is_cuda(x: Any) -> bool:
    """Whether `x` lives in CUDA device memory (DLPack device type kDLCUDA or kDLCUDAManaged)."""
    device = getattr(x, "__dlpack_device__", None)
    if device is None or isinstance(x, np.ndarray):
        return False
    try:
        return int(device()[0]) in (2, 13)
    except Exception:  # not a DLPack producer after all
        return False


def is_cuda_device(device: Any) -> bool:
    """Whether a torch-style device ("cuda", "cuda:1", torch.device) names a CUDA device."""
    return device is not None and str(getattr(device, "type", device)).startswith("cuda")


def to_core(x: Any) -> Any:
    """The array as the C++ core takes it: numpy bfloat16 viewed as uint16, everything else as is."""
    if isinstance(x, np.ndarray) and x.dtype.name == "bfloat16":
        return x.view(np.uint16)
    return x


def empty(shape: tuple, dtype: str, kind: str = "numpy", device: Any = None) -> Any:
    """An uninitialised array of `dtype` ('float16', 'bfloat16', 'float32', 'uint8')."""
    if kind == "torch":
        torch = sys.modules.get("torch")
        if torch is None:
            import torch  # noqa: F811 - only when the caller asked for torch
        return torch.empty(shape, dtype=getattr(torch, dtype), device=device or "cpu")
    if dtype == "bfloat16":
        return np.empty(shape, dtype=BFLOAT16 if BFLOAT16 is not None else np.uint16)
    return np.empty(shape, dtype=dtype)


def kind_of(x: Any) -> str:
    return "torch" if is_torch(x) else "numpy"


def array_dtype(x: Any) -> str:
    """The element type of an input array ('uint16' numpy arrays hold bfloat16 bit patterns)."""
    if isinstance(x, np.ndarray) and x.dtype == np.uint16:
        return "bfloat16"
    return dtype_name(x.dtype)

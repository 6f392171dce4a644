"""tqkv.Codec: TurboQuant (and raw fp16/bf16/fp32) codes of head vectors, as in the C++ library."""
from __future__ import annotations

from typing import Any, Optional

from . import _arrays, _tqkv


class Codec:
    """A codec resolved for one head dimension: ``Codec("tq3", head_dim=128)``.

    ``spec`` is any spec the library parses (docs/codec.md): ``fp16``, ``bf16``, ``fp32``,
    ``tq2``, ``tq2.5``, ``tq3``, ``tq3.5``, ``tq4``, with ``,key=value`` modifiers
    (``tq3,norm=f16``) or the general ``tq:b=3,rot=haar,seed=7``, or the transform codec
    ``kl:B`` (B bits per value, e.g. ``kl:2.5``).

    ``encode`` and ``decode`` take arrays ``[..., head_dim]`` (numpy, or anything with
    ``__dlpack__`` such as a CPU torch tensor) of float16, bfloat16 or float32, and give the same
    codes, bit for bit, as the C++ library and the ``tqkv`` command. Codes are uint8
    ``[..., code_bytes]``. The GIL is released while the library's thread pool works
    (``tqkv.set_num_threads``).

    Split codecs (tq2.5, tq3.5) keep a few outlier channels at more bits; which channels is the
    group metadata (``meta_bytes`` bytes) chosen from a group of vectors by ``select_meta``,
    and needed by both ``encode`` and ``decode``. ``kl:B`` has group metadata too: its bits,
    mean and scale per channel, fitted by ``select_meta`` on the group's vectors.
    """

    def __init__(self, spec: str, head_dim: int) -> None:
        self._c = _tqkv.Codec(spec, head_dim)

    @property
    def spec(self) -> str:
        """The canonical spec string (a preset name where one matches)."""
        return self._c.spec

    @property
    def label(self) -> str:
        """The codec's name as ``tqkv inspect`` prints it."""
        return self._c.label

    @property
    def head_dim(self) -> int:
        return self._c.head_dim

    @property
    def code_bytes(self) -> int:
        """Bytes of one encoded vector."""
        return self._c.code_bytes

    @property
    def meta_bytes(self) -> int:
        """Bytes of a group's metadata (split codecs), else 0."""
        return self._c.meta_bytes

    @property
    def split(self) -> bool:
        """True for codecs with group metadata: outlier channels, or kl's fit (they need ``meta``)."""
        return self._c.meta_bytes > 0

    @property
    def bits_per_value(self) -> float:
        """Stored bits per element (norms included; group metadata left out, see
        ``bits_per_value_for``)."""
        return self._c.bits_per_value(0)

    def bits_per_value_for(self, vectors_per_group: int) -> float:
        """Stored bits per element with the group metadata amortised over the group."""
        return self._c.bits_per_value(vectors_per_group)

    @property
    def ratio(self) -> float:
        """Compression against float16: 16 / bits_per_value."""
        return 16.0 / self.bits_per_value

    def select_meta(self, x: Any) -> Any:
        """The group metadata of the vectors of ``x`` (split codecs): a uint8 array of
        ``meta_bytes`` marking the outlier channels with the largest energy."""
        meta = _arrays.empty((self.meta_bytes,), "uint8", _arrays.kind_of(x), _device(x))
        self._c.select_meta(_arrays.to_core(x), meta)
        return meta

    def encode(self, x: Any, *, meta: Optional[Any] = None, out: Optional[Any] = None) -> Any:
        """Encodes ``x`` ``[..., head_dim]`` into uint8 codes ``[..., code_bytes]``.

        ``out``: a uint8 array of that shape to write into (nothing is allocated). ``meta``: the
        group metadata, required by split codecs (``select_meta(x)``).
        """
        if out is None:
            out = _arrays.empty(tuple(x.shape[:-1]) + (self.code_bytes,), "uint8",
                                _arrays.kind_of(x), _device(x))
        self._c.encode(_arrays.to_core(x), _arrays.to_core(out), meta)
        return out

    def decode(self, codes: Any, *, meta: Optional[Any] = None, out: Optional[Any] = None,
               dtype: Any = "float32") -> Any:
        """Decodes uint8 codes ``[..., code_bytes]`` into vectors ``[..., head_dim]``.

        ``out``: an array of float16, bfloat16 or float32 to write into (its dtype wins over
        ``dtype``). ``meta``: the metadata the codes were encoded with (split codecs).
        """
        if out is None:
            out = _arrays.empty(tuple(codes.shape[:-1]) + (self.head_dim,),
                                _arrays.dtype_name(dtype), _arrays.kind_of(codes), _device(codes))
        self._c.decode(codes, _arrays.to_core(out), meta)
        return out

    def __repr__(self) -> str:
        return f"tqkv.Codec({self.spec!r}, head_dim={self.head_dim})"


def _device(x: Any) -> Any:
    return getattr(x, "device", None) if _arrays.is_torch(x) else None

"""Torch tensors through DLPack (torch is not a dependency: skipped when it is not installed)."""
import numpy as np
import pytest

import tqkv
from conftest import session_arrays

torch = pytest.importorskip("torch")


def test_codec_and_session_on_torch(tmp_path):
    k, v = session_arrays(dtype=np.float32)
    kt = torch.from_numpy(k).to(torch.bfloat16)
    vt = torch.from_numpy(v).to(torch.bfloat16)
    c = tqkv.Codec("tq3", head_dim=64)
    codes = c.encode(kt[0])
    assert isinstance(codes, torch.Tensor) and codes.dtype == torch.uint8
    y = c.decode(codes, dtype="bfloat16")
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16
    store = tqkv.open_store(str(tmp_path))
    st = tqkv.checkpoint(store, "s", kt, vt)
    assert st["staged"] is False
    ko, vo = torch.zeros_like(kt), torch.zeros_like(vt)
    ptr = ko.data_ptr()
    tqkv.restore(store, "s", out=(ko, vo))
    assert ko.data_ptr() == ptr and ko.abs().sum() > 0
    nk, _ = tqkv.restore(store, "s", dtype="bfloat16", array="torch")
    assert torch.equal(nk, ko)
    # transformers layout: [layers][kv_heads, tokens, head_dim] tensors, a transposed view
    hk = [kt[i].transpose(0, 1) for i in range(kt.shape[0])]
    hv = [vt[i].transpose(0, 1) for i in range(vt.shape[0])]
    tqkv.checkpoint(store, "h", hk, hv, layout="hnd")
    assert store.inspect("h") == store.inspect("s")

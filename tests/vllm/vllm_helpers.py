"""What the vLLM tests share: the model, one vLLM process per call, the connector's config, the
prompts (conftest.py builds the fixtures from these)."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = Path(__file__).resolve().parent / "run_vllm.py"

_STORY = ("You are a careful assistant. Here is a story about a lighthouse keeper named Ada who lived "
          "on a small island. Every evening she climbed the stairs, cleaned the lens, and wrote the "
          "weather in her log. ")
CHUNK = 256  # the connector's default chunk (tqkv.vllm.DEFAULT_CHUNK_TOKENS) at vLLM's CPU block
BLOCK = 128  # vLLM 0.32's CPU block size
# 683 tokens: 2 chunks and a tail of one block stored (640 reusable); LONGER: 955, 3 and a tail
PROMPT = _STORY * 16 + "Question: what did Ada do every evening? Answer:"
LONGER = PROMPT + (" She climbed the stairs and cleaned the lens. The next morning a ship came to the "
                   "island with letters and bread, and the captain asked Ada about the storm." * 8
                   + " Question: where did Ada live, and who came in the morning? Answer:")


def connector(store: Path, **extra) -> str:
    return json.dumps({"kv_connector": "TqkvConnector", "kv_connector_module_path": "tqkv.vllm",
                       "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                       "kv_connector_extra_config": {"store": str(store), **extra}})


def serve(model: str, prompts, tmp: Path, name: str, conn: str = "", logprobs: int = 0,
          max_tokens: int = 16, split_kv: bool = True, prefix_caching: bool = False,
          in_process: bool = True) -> list:
    """Runs one fresh vLLM process on the prompts (text or {"prompt_token_ids": [...]}; greedy);
    returns its results. in_process: vLLM's engine and worker in that one process (12 s here
    against 27 s for vLLM's default of three processes); False: as deployed, the connector's
    metadata crossing from the engine's process to the worker's."""
    pj, out, log = tmp / f"{name}.prompts.json", tmp / f"{name}.json", tmp / f"{name}.log"
    pj.write_text(json.dumps([p if isinstance(p, dict) else {"prompt": p} for p in prompts]))
    cmd = [sys.executable, str(RUN), "--model", model, "--prompts", str(pj), "--out", str(out),
           "--max-tokens", str(max_tokens), "--ignore-eos"]
    if conn:
        cmd += ["--connector", conn]
    if logprobs:
        cmd += ["--logprobs", str(logprobs)]
    if prefix_caching:
        cmd += ["--prefix-caching"]
    if in_process:
        cmd += ["--in-process"]
    env = dict(os.environ)
    if not split_kv:
        env["VLLM_CPU_ATTN_SPLIT_KV"] = "0"
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=900, env=env)
    text = log.read_text()
    if r.returncode != 0 and shutdown_abort(text) and out.exists():
        # vLLM 0.32's engine teardown, after the results were written (docs/vllm.md, Limits)
        print(f"[{name}] WARNING: vLLM aborted in its shutdown (rc {r.returncode}): "
              "'terminate called without an active exception'; the results were complete")
    else:
        assert r.returncode == 0, text[-6000:]
    for line in text.splitlines():
        if "tqkv connector" in line:
            print(f"[{name}] " + line.split("] ", 1)[-1])
    return json.loads(out.read_text())


def reusable(prompt_tokens: int) -> int:
    """What the connector stores of a prompt and restores of it: every whole block before its
    last token (tqkv.vllm.scheduler)."""
    return (prompt_tokens - 1) // BLOCK * BLOCK


def chunk_files(store: Path) -> list:
    return sorted(store.rglob("*.tqkv"))


def shutdown_abort(log: str) -> bool:
    """The process aborted only once vLLM's shutdown had begun: "terminate called without an active
    exception" after "[shutdown]" lines, nothing else failing."""
    at = log.rfind("terminate called without an active exception")
    return at > 0 and "[shutdown]" in log[:at] and "Traceback" not in log


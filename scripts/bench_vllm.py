#!/usr/bin/env python3
"""Time to first token for a returning user in vLLM (CPU): recompute vs ExampleConnector vs tqkv.

    PY=$(scripts/setup-vllm.sh); PYTHONPATH=build/python $PY scripts/bench_vllm.py \
        --model $($PY scripts/vllm_model.py) --tokens 8192 [--modes recompute,example,fp16,tq3]

For each mode a first vLLM process serves a prompt of --tokens random token ids (and saves it
through the connector); a fresh second process serves a short warm-up prompt, then the same prompt
with max_tokens=1: its wall time is the returning user's time to first token. Prints one JSON
object: per mode the seconds, the tokens vLLM reports cached (restored), and the bytes the store
holds for the session. Name the CPU with the figures (docs/lab/vllm.md).
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

RUN = Path(__file__).resolve().parent.parent / "tests" / "vllm" / "run_vllm.py"


def serve(model: str, prompts: list, conn: str, work: Path, name: str, max_len: int) -> list:
    pj, out = work / f"{name}.prompts.json", work / f"{name}.json"
    pj.write_text(json.dumps(prompts))
    cmd = [sys.executable, str(RUN), "--model", model, "--prompts", str(pj), "--out", str(out),
           "--max-tokens", "1", "--max-model-len", str(max_len)]
    if conn:
        cmd += ["--connector", conn]
    with open(work / f"{name}.log", "w") as log:
        r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if r.returncode:
        sys.exit(f"bench_vllm: {name} failed, see {work / (name + '.log')}")
    return json.loads(out.read_text())


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--modes", default="recompute,example,fp16,tq3")
    ap.add_argument("--work", default="", help="keep the stores and logs here")
    a = ap.parse_args()
    rng = random.Random(0)
    prompt = {"prompt_token_ids": [rng.randrange(100, 40000) for _ in range(a.tokens)]}
    warm = {"prompt_token_ids": [rng.randrange(100, 40000) for _ in range(256)]}
    work = Path(a.work or tempfile.mkdtemp(prefix="tqkv-bench-vllm-"))
    work.mkdir(parents=True, exist_ok=True)
    max_len = a.tokens + 64
    results = {"model": a.model, "tokens": a.tokens, "cpu_count": os.cpu_count(), "modes": {}}
    for mode in a.modes.split(","):
        store = work / f"store-{mode}"
        shutil.rmtree(store, ignore_errors=True)
        if mode == "recompute":
            conn = ""
        elif mode == "example":
            store.mkdir()
            conn = json.dumps({"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                               "kv_connector_extra_config": {"shared_storage_path": str(store)}})
        else:
            conn = json.dumps({"kv_connector": "TqkvConnector",
                               "kv_connector_module_path": "tqkv.vllm", "kv_role": "kv_both",
                               "kv_load_failure_policy": "recompute",
                               "kv_connector_extra_config": {"store": str(store), "codec": mode}})
        first = serve(a.model, [prompt], conn, work, f"{mode}-first", max_len)[0] if conn else None
        stored = du(store)
        second = serve(a.model, [warm, prompt], conn, work, f"{mode}-second", max_len)[1]
        results["modes"][mode] = {
            "ttft_s": round(second["seconds"], 3), "cached_tokens": second["num_cached_tokens"],
            "first_process_s": None if first is None else round(first["seconds"], 3),
            "stored_bytes": stored}
        print(json.dumps({mode: results["modes"][mode]}), file=sys.stderr, flush=True)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

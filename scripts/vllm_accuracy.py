#!/usr/bin/env python3
"""Accuracy of the vLLM connector's restores, teacher-forced in one request (docs/vllm.md).

    PY=$(scripts/setup-vllm.sh); PYTHONPATH=build/python $PY scripts/vllm_accuracy.py \
        --model $($PY scripts/vllm_model.py) --tokens 1024,4096 --codec fp16 --codec tq3 \
        --codec tq4 [--prompt-file /usr/share/common-licenses/GPL-3] [--steps 50] > out.json

Per prompt length N and codec, one fresh vLLM (CPU) process with the connector (saves in the
step): request 0 is the first N tokens of the prompt file with STEPS greedy tokens and their
top-20 logprobs (the reference, computed: the store is empty; its full chunks are saved); request
1 is those N tokens plus the STEPS generated ones in one request with prompt_logprobs=20,
skip_reading_prefix_cache=False and detokenize=False, so vLLM restores the stored chunks and
computes only the rest. Compared per step: top-1 agreement and a lower bound of the KL (the
reference's top-20 plus a rest bucket), mean and max. Progress on stderr, JSON on stdout.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUN = Path(__file__).resolve().parent.parent / "tests" / "vllm" / "run_vllm.py"


def note(msg):
    print(f"vllm_accuracy {time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.1f}: {msg}",
          file=sys.stderr, flush=True)


def coarse_kl(ref, test):
    floor = min(test.values())
    kl = p_in = q_in = 0.0
    for t, lp in ref.items():
        lq = test.get(t, floor)
        p, q = math.exp(lp), math.exp(lq)
        kl += p * (lp - lq)
        p_in += p
        q_in += q
    p_rest, q_rest = max(1.0 - p_in, 1e-12), max(1.0 - q_in, 1e-12)
    return kl + p_rest * math.log(p_rest / q_rest)


def top(d):
    return int(max(d.items(), key=lambda kv: kv[1])[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", default="1024,4096")
    ap.add_argument("--codec", action="append")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--prompt-file", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--max-model-len", type=int, default=8192)
    a = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.model)
    ids = tok(Path(a.prompt_file).read_text())["input_ids"]
    work = Path(tempfile.mkdtemp(prefix="vllm-acc-"))
    out = {"model": a.model, "prompt_file": a.prompt_file, "steps": a.steps, "rows": []}
    for n in [int(t) for t in a.tokens.split(",")]:
        if len(ids) < n:
            sys.exit(f"the prompt file has {len(ids)} tokens, fewer than {n}")
        for codec in a.codec or ["fp16", "tq3", "tq4"]:
            name = f"n{n}-{codec}"
            store = work / f"store-{name}"
            conn = json.dumps({"kv_connector": "TqkvConnector",
                               "kv_connector_module_path": "tqkv.vllm", "kv_role": "kv_both",
                               "kv_load_failure_policy": "recompute",
                               "kv_connector_extra_config": {"store": str(store), "codec": codec,
                                                             "async_save": False}})
            reqs = [{"prompt_token_ids": ids[:n], "max_tokens": a.steps, "logprobs": 20},
                    {"continue_from": 0, "teacher": True, "max_tokens": 1,
                     "prompt_logprobs": 20, "logprobs": 0}]
            pj, res, log = work / f"{name}.json", work / f"{name}.out", work / f"{name}.log"
            pj.write_text(json.dumps(reqs))
            note(f"{name}: vLLM")
            with open(log, "w") as f:
                r = subprocess.run([sys.executable, str(RUN), "--model", a.model, "--prompts",
                                    str(pj), "--out", str(res), "--ignore-eos",
                                    "--max-model-len", str(a.max_model_len), "--connector", conn],
                                   stdout=f, stderr=subprocess.STDOUT,
                                   env={**os.environ,
                                        "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600"})
            if r.returncode:
                sys.exit(f"{name} failed, see {log}")
            r0, r1 = json.loads(res.read_text())
            ref = r0["logprobs"]
            got = [r1["prompt_logprobs"][n + j] for j in range(a.steps)]
            agree = sum(top(x) == top(y) for x, y in zip(ref, got))
            kls = [coarse_kl(x, y) for x, y in zip(ref, got)]
            row = {"tokens": n, "codec": codec, "restored": r1["num_cached_tokens"],
                   "top1": agree, "steps": a.steps, "mean_kl": sum(kls) / len(kls),
                   "max_kl": max(kls),
                   "bytes": sum(p.stat().st_size for p in store.rglob("*.tqkv"))}
            note(f"{name}: restored {row['restored']}, top-1 {agree}/{a.steps}, mean KL "
                 f"{row['mean_kl']:.4f}, max {row['max_kl']:.4f}, {row['bytes']} bytes")
            out["rows"].append(row)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Accuracy of the vLLM connector's restores, teacher-forced in one request (docs/vllm.md).

    PY=$(scripts/setup-vllm.sh); PYTHONPATH=build/python $PY scripts/vllm_accuracy.py \
        --model $($PY scripts/vllm_model.py) --tokens 1024,4096 --codec fp16 --codec tq3 \
        --codec tq4 [--prompt-file /usr/share/common-licenses/GPL-3] [--steps 50] > out.json

Per prompt length N and codec, one fresh vLLM (CPU) process with the connector (saves in the
step): request 0 is the first N tokens of the prompt file with STEPS greedy tokens and their
top-20 logprobs (the decode steps; computed: the store is empty; its full chunks are saved);
request 1 is those N tokens plus the STEPS generated ones in one request with
prompt_logprobs=20, skip_reading_prefix_cache=False and detokenize=False, so vLLM restores the
stored chunks and computes only the rest. "none" is the same two requests without a connector
(request 1 then computes every position). Compared per forced step (a step whose logits vLLM did
not compute, the first after a prefix restored whole, is skipped): top-1 agreement and a lower
bound of the KL (the reference's top-20 plus a rest bucket), mean and max, against the decode
steps (as docs/accuracy.md's llama.cpp figures) and against none's request 1 (the restore alone)
up to the first step where the two processes' continuations differ. With --cache each codec's
process also has vLLM's own prefix cache: request 1 takes its prefix from it, the cache is reset
and request 2, the same tokens, takes it from the connector; "cache" compares requests 1 and 2,
every forced step (the same process, the same continuation). Progress on stderr, JSON on stdout.
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


def analyze(work: Path, n: int, codec: str, steps: int) -> dict:
    """One codec's row from the saved outputs of its process and of "none"'s."""
    def forced(name, which=-1):
        rs = json.loads((work / f"n{n}-{name}.out").read_text())
        r0, r1 = rs[0], rs[which]
        restored = r1["num_cached_tokens"]
        # position n + j predicts step j from logits computed at n + j - 1: skip those restored
        return r0, r1, {j: r1["prompt_logprobs"][n + j] for j in range(steps)
                        if n + j - 1 >= restored}
    def alike(name):
        # another process's request 1 forces its own continuation: comparable up to the first
        # step where the two greedy continuations differ (vLLM's CPU decode differs run to run)
        o0, _, theirs = forced(name)
        same = next((j for j, (x, y) in enumerate(zip(r0["tokens"], o0["tokens"])) if x != y),
                    steps)
        return {j: d for j, d in theirs.items() if j <= same}
    r0, r1, got = forced(codec)
    store = work / f"store-n{n}-{codec}"
    row = {"tokens": n, "codec": codec, "restored": r1["num_cached_tokens"], "steps": len(got),
           "bytes": sum(p.stat().st_size for p in store.rglob("*.tqkv"))}
    refs = [("decode", dict(enumerate(r0["logprobs"]))), ("none", alike("none"))]
    if len(json.loads((work / f"n{n}-{codec}.out").read_text())) == 3:
        # --cache: request 1 took the prefix from vLLM's own prefix cache in this same process,
        # request 2 (got) from the connector after a reset: same tokens, same continuation
        _, c1, cached = forced(codec, 1)
        refs.append(("cache", cached))
        row["cache_restored"] = c1["num_cached_tokens"]
    for what, ref in refs:
        js = [j for j in got if j in ref]
        agree = sum(top(ref[j]) == top(got[j]) for j in js)
        kls = [coarse_kl(ref[j], got[j]) for j in js]
        row[what] = {"steps": len(js), "top1": agree, "mean_kl": sum(kls) / max(1, len(kls)),
                     "max_kl": max(kls, default=0.0), "identical": sum(ref[j] == got[j] for j in js)}
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", default="1024,4096")
    ap.add_argument("--codec", action="append")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--prompt-file", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--chunk-tokens", type=int, default=0,
                    help="the connector's chunk_tokens (0: its default)")
    ap.add_argument("--cache", action="store_true",
                    help="each codec's process with vLLM's own prefix cache on: request 1 takes "
                         "its prefix from vLLM's cache, then the cache is reset and request 2 "
                         "(the same tokens) takes it from the connector; compared as \"cache\" "
                         "(with --chunk-tokens at vLLM's block size both reuse the same tokens)")
    ap.add_argument("--reanalyze", default="", help="a work directory of an earlier run: its "
                    "rows again from the saved outputs, no vLLM")
    a = ap.parse_args()
    if a.reanalyze:
        work = Path(a.reanalyze)
        rows = [analyze(work, int(f.name.split("-")[0][1:]), f.name.split("-", 1)[1][:-4],
                        a.steps) for f in sorted(work.glob("n*-*.out"))]
        print(json.dumps({"model": a.model, "steps": a.steps, "rows": rows}, indent=1))
        return 0
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.model)
    ids = tok(Path(a.prompt_file).read_text())["input_ids"]
    work = Path(tempfile.mkdtemp(prefix="vllm-acc-"))
    out = {"model": a.model, "prompt_file": a.prompt_file, "steps": a.steps, "rows": []}
    for n in [int(t) for t in a.tokens.split(",")]:
        if len(ids) < n:
            sys.exit(f"the prompt file has {len(ids)} tokens, fewer than {n}")
        for codec in ["none"] + (a.codec or ["fp16", "tq3", "tq4"]):
            name = f"n{n}-{codec}"
            store = work / f"store-{name}"
            extra = {"store": str(store), "codec": codec, "async_save": False}
            if a.chunk_tokens:
                extra["chunk_tokens"] = a.chunk_tokens
            conn = "" if codec == "none" else json.dumps({
                "kv_connector": "TqkvConnector", "kv_connector_module_path": "tqkv.vllm",
                "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                "kv_connector_extra_config": extra})
            reqs = [{"prompt_token_ids": ids[:n], "max_tokens": a.steps, "logprobs": 20},
                    {"continue_from": 0, "teacher": True, "max_tokens": 1,
                     "prompt_logprobs": 20, "logprobs": 0}]
            if a.cache and conn:
                reqs.append({**reqs[1], "reset_prefix_cache": True})
            pj, res, log = work / f"{name}.json", work / f"{name}.out", work / f"{name}.log"
            pj.write_text(json.dumps(reqs))
            note(f"{name}: vLLM")
            with open(log, "w") as f:
                r = subprocess.run([sys.executable, str(RUN), "--model", a.model, "--prompts",
                                    str(pj), "--out", str(res), "--ignore-eos",
                                    "--max-model-len", str(a.max_model_len)]
                                   + (["--connector", conn] if conn else [])
                                   + (["--prefix-caching"] if a.cache and conn else []),
                                   stdout=f, stderr=subprocess.STDOUT,
                                   env={**os.environ,
                                        "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600"})
            if r.returncode:
                sys.exit(f"{name} failed, see {log}")
            row = analyze(work, n, codec, a.steps)
            d, p = row["decode"], row["none"]
            c = row.get("cache")
            note(f"{name}: restored {row['restored']}, {row['steps']} steps; vs decode: top-1 "
                 f"{d['top1']}, mean KL {d['mean_kl']:.4f}; vs none: top-1 {p['top1']}, mean KL "
                 f"{p['mean_kl']:.5f}, identical {p['identical']}"
                 + (f"; vs cache ({row['cache_restored']} cached): mean KL {c['mean_kl']:.5f}, "
                    f"identical {c['identical']}/{c['steps']}" if c else "")
                 + f"; {row['bytes']} bytes")
            out["rows"].append(row)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""One vLLM (CPU) process: serves prompts, optionally through a KV connector, prints JSON.

    python tests/vllm/run_vllm.py --model DIR --prompts prompts.json [--connector JSON]
        [--max-tokens 8] [--prompt-logprobs] [--out result.json]

prompts.json: a list of {"prompt": str} or {"prompt_token_ids": [...]} dicts, served one at a time
(a returning user comes back after the previous turn finished). For each: the greedy token ids,
--logprobs K: the top-K logprobs of each generated token's distribution,
num_cached_tokens (local prefix cache + connector), the seconds to the first token (max_tokens=1
runs time the prefill), and with --prompt-logprobs the top-1 token and the logprobs of the prompt
positions (for teacher-forced comparisons). Used by tests/vllm/test_vllm.py and
scripts/bench_vllm.py.
"""
import argparse
import json
import os
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--connector", default="", help="the --kv-transfer-config JSON")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--prompt-logprobs", type=int, default=0,
                    help="return this many prompt logprobs per position (0: none)")
    ap.add_argument("--teacher", action="store_true",
                    help="teacher forcing in one request: vLLM computes only the positions past "
                         "a restored prefix (skip_reading_prefix_cache=False, detokenize=False)")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--ignore-eos", action="store_true", help="always generate max_tokens")
    ap.add_argument("--logprobs", type=int, default=0,
                    help="return this many logprobs per generated token (0: none)")
    ap.add_argument("--prefix-caching", action="store_true",
                    help="vLLM's own prefix cache on (off by default, so a hit is the connector's)")
    ap.add_argument("--in-process", action="store_true",
                    help="vLLM's engine and worker in this process (no engine-core and worker "
                         "processes: each costs its own imports), the connector's metadata then "
                         "passed without crossing a process")
    ap.add_argument("--out", default="")
    a = ap.parse_args()

    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if a.in_process:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams

    kwargs = dict(model=a.model, enforce_eager=True, max_model_len=a.max_model_len,
                  enable_prefix_caching=a.prefix_caching, seed=0)
    if a.in_process:
        kwargs["distributed_executor_backend"] = "uni"
    if a.connector:
        from vllm.config import KVTransferConfig

        kwargs["kv_transfer_config"] = KVTransferConfig(**json.loads(a.connector))
    llm = LLM(**kwargs)
    with open(a.prompts) as f:
        prompts = json.load(f)
    results = []
    for p in prompts:
        # per-prompt overrides; "continue_from": i teacher-forces result i's generated tokens
        # (its prompt plus its tokens, prompt logprobs returned, one request); "reset_prefix_cache"
        # empties vLLM's own prefix cache first, so a reused prefix then comes from the connector
        p = dict(p)
        if p.pop("reset_prefix_cache", False) and not llm.reset_prefix_cache():
            sys.exit("vLLM refused to reset its prefix cache")
        teacher, max_tokens = p.pop("teacher", a.teacher), p.pop("max_tokens", a.max_tokens)
        plp, lp = p.pop("prompt_logprobs", a.prompt_logprobs), p.pop("logprobs", a.logprobs)
        if "continue_from" in p:
            prev = results[p.pop("continue_from")]
            p = {"prompt_token_ids": prev["prompt_token_ids"] + prev["tokens"]}
        extra = dict(skip_reading_prefix_cache=False, detokenize=False) if teacher else {}
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=a.ignore_eos,
                            prompt_logprobs=plp or None, logprobs=lp or None, **extra)
        t0 = time.perf_counter()
        out = llm.generate([p], sp, use_tqdm=False)[0]
        seconds = time.perf_counter() - t0
        r = {"tokens": list(out.outputs[0].token_ids), "text": out.outputs[0].text or "",
             "num_cached_tokens": out.num_cached_tokens,
             "prompt_tokens": len(out.prompt_token_ids), "seconds": seconds,
             "prompt_token_ids": list(out.prompt_token_ids)}
        if lp:
            r["logprobs"] = [{str(t): x.logprob for t, x in d.items()}
                             for d in out.outputs[0].logprobs]
        if plp:
            # Position i's dict holds the logprobs of prompt token i given tokens < i.
            r["prompt_logprobs"] = [
                None if d is None else {str(t): x.logprob for t, x in d.items()}
                for d in out.prompt_logprobs]
        results.append(r)
    text = json.dumps(results)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

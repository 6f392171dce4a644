"""End-to-end tests of tqkv.vllm.TqkvConnector in vLLM on the CPU (SmolLM2-135M-Instruct).

Run with the venv of scripts/setup-vllm.sh and the tqkv package on PYTHONPATH:

    PY=$(scripts/setup-vllm.sh) && PYTHONPATH=build/python $PY -m pytest -s -q tests/vllm

Each vLLM process takes about a minute here, so CI runs a returning user with the fp16 codec
(two processes) and one teacher-forced case (tq3, one process); TQKV_VLLM_FULL=1 adds the
no-connector floor and fp16/tq4 (or the codecs in TQKV_VLLM_CODECS), a corrupted object and a
different model.
Skips only when vLLM or the model download is missing.
"""
import json
import math
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run scripts/setup-vllm.sh and use its python")

from vllm_helpers import (CHUNK, LONGER, PROMPT, chunk_files, connector,  # noqa: E402
                          reusable, serve)

FULL = os.environ.get("TQKV_VLLM_FULL") == "1"
full_only = pytest.mark.skipif(not FULL, reason="set TQKV_VLLM_FULL=1 (several vLLM processes)")


def test_fp16_returning_user(fp16_run):
    a, b = fp16_run["a"], fp16_run["b"]
    assert a[0]["num_cached_tokens"] == 0  # empty store: computed
    # A's chunks were written by the connector's background writer (async_save, the default)
    assert "chunks" in (fp16_run["tmp"] / "A.log").read_text().split("(background)")[0]
    end = reusable(a[0]["prompt_tokens"])
    n_chunks, tail = divmod(end, CHUNK)
    assert n_chunks >= 2 and tail > 0  # PROMPT's length gives it a tail
    assert len(fp16_run["stored"]) == n_chunks + 1
    # B restores the full chunks and the tail and generates exactly what A generated
    assert b[0]["num_cached_tokens"] == end
    assert b[0]["tokens"] == a[0]["tokens"]
    # the longer prompt (the next turn) restores the same, PROMPT's tail included
    assert b[1]["num_cached_tokens"] == end
    # B stored the chunks LONGER added beyond PROMPT's chunks and LONGER's own tail
    end_l = reusable(b[1]["prompt_tokens"])
    assert len(chunk_files(fp16_run["store"])) == \
        n_chunks + 1 + end_l // CHUNK - n_chunks + (end_l % CHUNK > 0)
    print(f"fp16: A {a[0]['tokens']}\n      B {b[0]['tokens']} (cached {b[0]['num_cached_tokens']})"
          f"; longer prompt {b[1]['prompt_tokens']} tokens, cached {b[1]['num_cached_tokens']}")


def _top(d: dict) -> int:
    return int(max(d.items(), key=lambda kv: kv[1])[0])


def coarse_kl(ref: dict, test: dict) -> float:
    """KL(ref || test) between the two distributions coarsened to ref's top-k tokens plus one
    'rest' bucket: a lower bound on the full-vocabulary KL. A token of ref's top-k missing from
    test's top-k gets test's smallest listed logprob (an upper bound on its probability)."""
    floor = min(test.values())
    kl, p_in, q_in = 0.0, 0.0, 0.0
    for t, lp in ref.items():
        lq = test.get(t, floor)
        p, q = math.exp(lp), math.exp(lq)
        kl += p * (lp - lq)
        p_in += p
        q_in += q
    p_rest, q_rest = max(1.0 - p_in, 1e-12), max(1.0 - q_in, 1e-12)
    return kl + p_rest * math.log(p_rest / q_rest)


def _compare(ref: list, test: list) -> tuple:
    """Top-1 agreement and the mean and max coarse KL of per-step top-k logprob dicts."""
    agree = [_top(r) == _top(t) for r, t in zip(ref, test)]
    kls = [coarse_kl(r, t) for r, t in zip(ref, test)]
    return sum(agree) / len(agree), sum(kls) / len(kls), max(kls)


# TQKV_VLLM_CODECS: the codecs of test_teacher_forced with TQKV_VLLM_FULL=1 (CI: tq3 alone)
CODECS = os.environ.get("TQKV_VLLM_CODECS", "fp16,tq3,tq4").split(",") if FULL else ["tq3"]
STEPS = 32


def teacher_forced(model: str, tmp: Path, name: str, conn: str, prompt) -> tuple:
    """One process: request 0 generates STEPS greedy tokens after `prompt` with their top-20
    logprobs (the reference; with a connector it also stores the prompt's chunks, in the step);
    request 1 is the prompt plus those tokens in one request with prompt_logprobs=20, so vLLM
    restores the stored prefix and computes the rest. Returns (request 0, request 1)."""
    reqs = [{"prompt": prompt, "max_tokens": STEPS, "logprobs": 20},
            {"continue_from": 0, "teacher": True, "max_tokens": 1, "prompt_logprobs": 20}]
    r0, r1 = serve(model, reqs, tmp, name, conn)
    return r0, r1


def forced_steps(r0: dict, r1: dict) -> tuple:
    """(request 0's decode steps, request 1's distributions at the same forced positions):
    position P + j predicts step j from logits computed at P + j - 1, so the steps whose logits
    vLLM did not compute (inside the restored prefix) are left out."""
    p, restored = r0["prompt_tokens"], r1["num_cached_tokens"]
    steps = [j for j in range(STEPS) if p + j - 1 >= restored]
    return [r0["logprobs"][j] for j in steps], [r1["prompt_logprobs"][p + j] for j in steps]


def test_teacher_forced(model, tmp_path):
    # The reference is request 0's decode steps; request 1 restores what request 0 stored
    # (reusable(P): chunks and a tail) and computes the STEPS forced positions (the first
    # position after the prefix has no computed logits in vLLM 0.32, but it lies inside the
    # prompt here). "none": the same two requests without a connector (nothing restored: the
    # protocol's floor, prefill against decode).
    results = {}
    rows = []
    if FULL:
        n0, n1 = teacher_forced(model, tmp_path, "none", "", LONGER)
        assert n1["num_cached_tokens"] == 0
        results["none"] = _compare(*forced_steps(n0, n1))
    for codec in CODECS:
        store = tmp_path / f"store-{codec}"
        r0, r1 = teacher_forced(model, tmp_path, f"T-{codec}",
                                connector(store, codec=codec, async_save=False), LONGER)
        assert r1["num_cached_tokens"] == reusable(r0["prompt_tokens"]) > 0, codec
        results[codec] = _compare(*forced_steps(r0, r1))
        size = sum(f.stat().st_size for f in chunk_files(store))
        rows.append(f"  {codec}: restored {r1['num_cached_tokens']} of {r0['prompt_tokens']} "
                    f"prompt tokens ({size} bytes)")
    print(f"teacher-forced in one request, {STEPS} steps after a {r0['prompt_tokens']}-token "
          "prompt (top-1, mean KL, max KL vs the decode steps):")
    for codec, (top1, kl, mx) in results.items():
        print(f"  {codec}: top-1 {top1:.3f}, mean KL {kl:.4f}, max {mx:.4f}")
    print("\n".join(rows))
    # floors that catch a broken restore (garbage KV agrees on few tokens), not quality targets
    for codec, (top1, kl, _) in results.items():
        assert top1 >= 0.5 and kl < 1.0, codec


def test_bf16_restore_is_vllms_own_prefix_cache_bit_for_bit(model, tmp_path):
    # One process, vLLM's prefix cache on: request 1 takes PROMPT's prefix from vLLM's own cache,
    # request 2 (the same tokens, after the cache is reset) from the connector's bf16 chunks (the
    # KV vLLM computed, bit for bit: its CPU cache is bf16), so every forced position computed in
    # both requests must have the same top-20 logprobs. (fp16 is exact only for values in fp16's
    # normal range: SmolLM2's KV has smaller ones, docs/vllm.md "How exact".)
    store = tmp_path / "store"
    forced = {"continue_from": 0, "teacher": True, "max_tokens": 1, "prompt_logprobs": 20}
    r0, r1, r2 = serve(model, [{"prompt": PROMPT, "max_tokens": STEPS}, forced,
                               {**forced, "reset_prefix_cache": True}], tmp_path, "P",
                       connector(store, codec="bf16", async_save=False), prefix_caching=True)
    p, end = r0["prompt_tokens"], reusable(r0["prompt_tokens"])
    assert r1["num_cached_tokens"] >= end and r2["num_cached_tokens"] == end
    assert "tqkv connector: restored" in (tmp_path / "P.log").read_text()
    start = max(r1["num_cached_tokens"], r2["num_cached_tokens"]) + 1
    same = [r1["prompt_logprobs"][i] == r2["prompt_logprobs"][i]
            for i in range(start, p + STEPS)]
    assert len(same) >= STEPS and all(same), f"{sum(same)} of {len(same)} positions identical"
    print(f"bf16 restore vs vLLM's prefix cache: {len(same)} forced positions identical")


@full_only
def test_corrupt_object_is_a_miss(model, fp16_run, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(fp16_run["store"], store)
    victim = chunk_files(store)[0]
    data = bytearray(victim.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 64] = bytes(b ^ 0x5A for b in data[mid:mid + 64])
    victim.write_bytes(bytes(data))
    c = serve(model, [PROMPT], tmp_path, "C", connector(store, codec="fp16"))[0]
    log = (tmp_path / "C.log").read_text()
    assert "failed (recomputed)" in log or "a miss" in log
    assert c["tokens"] == fp16_run["a"][0]["tokens"]
    print(f"corrupt chunk: cached {c['num_cached_tokens']}, tokens identical to recompute")


@full_only
def test_different_model_is_a_miss(model, fp16_run, tmp_path):
    # the same weights under another config (a different model identity): never the stored KV
    other = tmp_path / "other-model"
    other.mkdir()
    for f in Path(model).iterdir():
        if f.name != "config.json":
            (other / f.name).symlink_to(f)
    cfg = json.loads((Path(model) / "config.json").read_text())
    cfg["max_position_embeddings"] = 4096
    (other / "config.json").write_text(json.dumps(cfg))
    d = serve(str(other), [PROMPT], tmp_path, "D", connector(fp16_run["store"], codec="fp16",
                                                             read_only=True))[0]
    assert d["num_cached_tokens"] == 0
    assert d["tokens"] == fp16_run["a"][0]["tokens"]
    print("different model: a miss, tokens identical to recompute")

#!/usr/bin/env python3
"""Time to first token for a returning user in vLLM (CPU): recompute vs ExampleConnector vs tqkv.

    PY=$(scripts/setup-vllm.sh); PYTHONPATH=build/python $PY scripts/bench_vllm.py \
        --model $($PY scripts/vllm_model.py) --tokens 8192 [--modes recompute,example,fp16,tq3] \
        [--link-gbps 0.05] [--turn2-tokens 512] [--cold] [--repeat 3]  # tokens+turn2+64 <= context

For each mode a first vLLM process serves a prompt P of --tokens random token ids (and saves it
through the connector); a fresh second process serves a short warm-up prompt, then P with
max_tokens=1: its wall time is the returning user's time to first token. With --link-gbps, tqkv
modes run that second process again with the store's reads through an emulated link of that many
GB/s (the store URI throttle://, which only the build tree's module opens, as above with
PYTHONPATH=build/python; docs/store.md §5); ExampleConnector cannot be throttled, so for it only
the computed (not measured) bytes / link is given. With --turn2-tokens N, a third process serves
turn 2 of the conversation, P + N new tokens: its time to first token, the tokens restored and the
bytes the store grew by (what turn 2 wrote). With --cold (root), the page cache is dropped before
the second and the turn-2 processes, so their restores read the disk (the model is loaded before
the timed prompt, so only the store's reads are cold); the link runs read the page cache, so the
emulated link alone limits them (the link's wait and a cold read would add up, chunk by chunk).
Progress goes to stderr; one JSON object to stdout:
per mode the seconds, the tokens vLLM reports cached (restored), the bytes the store holds for the
session, and for tqkv the bytes and seconds of the connector's restore (from its log). With
--repeat N the second, link and turn-2 processes run N times (rounds of every mode in turn, as
the load of a shared machine changes by the minute; turn 2 from turn 1's store each time): the
figures are the median run's, "runs" lists every run's. --reuse skips the first processes where
--work holds the stores of an earlier run. A mode "tq3@128" is tq3 with chunk_tokens 128.
Name the CPU and the load with the figures (docs/lab/vllm.md).
"""
import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

RUN = Path(__file__).resolve().parent.parent / "tests" / "vllm" / "run_vllm.py"
RESTORED = re.compile(r"tqkv connector: restored (\d+) chunks \((\d+) tokens, (\d+) bytes\) in "
                      r"([0-9.]+) s")
WAITED = re.compile(r"tqkv connector: the forward pass waited ([0-9.]+) s for restored layers")


def log(msg: str) -> None:
    print(f"bench_vllm {time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.1f}: {msg}",
          file=sys.stderr, flush=True)


def drop_page_cache() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def serve(model: str, prompts: list, conn: str, work: Path, name: str, max_len: int,
          cold: bool = False) -> dict:
    """Runs one vLLM process; returns the last prompt's result plus the connector's restores."""
    if cold:
        drop_page_cache()
    pj, out = work / f"{name}.prompts.json", work / f"{name}.json"
    pj.write_text(json.dumps(prompts))
    cmd = [sys.executable, str(RUN), "--model", model, "--prompts", str(pj), "--out", str(out),
           "--max-tokens", "1", "--max-model-len", str(max_len)]
    if conn:
        cmd += ["--connector", conn]
    log(f"{name}: starting vLLM")
    with open(work / f"{name}.log", "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode:
        sys.exit(f"bench_vllm: {name} failed, see {work / (name + '.log')}")
    res = json.loads(out.read_text())[-1]
    # the measured prompt is served last, so its restore is the last one logged
    restores = RESTORED.findall((work / f"{name}.log").read_text())[-1:]
    res["restore_bytes"] = sum(int(m[2]) for m in restores)
    res["restore_s"] = round(sum(float(m[3]) for m in restores), 3)
    waits = WAITED.findall((work / f"{name}.log").read_text())[-1:]
    res["forward_wait_s"] = round(sum(float(w) for w in waits), 3)
    log(f"{name}: {res['seconds']:.3f} s, {res['num_cached_tokens']} tokens cached")
    return res


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def connector(mode: str, store: Path, link: float) -> str:
    mode, _, chunk = mode.partition("@")
    if mode == "recompute":
        return ""
    if mode == "example":
        return json.dumps({"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                           "kv_connector_extra_config": {"shared_storage_path": str(store)}})
    extra = {"store": str(store), "codec": mode}
    if link:
        # Each connector opens the store once: one shared read bucket (per_object=0) is one
        # emulated link per connector process; writes unlimited.
        extra["store"] = (f"throttle://?store={urllib.parse.quote(str(store), safe='')}"
                          f"&read_rate={round(link * 1e9)}&write_rate=0&per_object=0")
    if chunk:
        extra["chunk_tokens"] = int(chunk)
    return json.dumps({"kv_connector": "TqkvConnector", "kv_connector_module_path": "tqkv.vllm",
                       "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                       "kv_connector_extra_config": extra})


def median_run(runs: list) -> dict:
    """The run of median TTFT (the lower middle one of an even count), with every run's TTFT and
    restore seconds under "runs" when there is more than one."""
    best = sorted(runs, key=lambda r: r["ttft_s"])[(len(runs) - 1) // 2]
    if len(runs) > 1:
        best = dict(best, runs=[{k: r[k] for k in ("ttft_s", "restore_s", "forward_wait_s",
                                                   "load_avg_1m")
                                 if k in r} for r in runs])
    return best


def ttft(res: dict) -> dict:
    out = {"ttft_s": round(res["seconds"], 3), "cached_tokens": res["num_cached_tokens"],
           "load_avg_1m": round(os.getloadavg()[0], 2)}
    if res["restore_bytes"]:
        out.update(restore_bytes=res["restore_bytes"], restore_s=res["restore_s"],
                   forward_wait_s=res["forward_wait_s"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--modes", default="recompute,example,fp16,tq3")
    ap.add_argument("--link-gbps", type=float, default=0.0,
                    help="also restore through an emulated link of this many GB/s (tqkv modes)")
    ap.add_argument("--turn2-tokens", type=int, default=0,
                    help="also serve turn 2: the prompt plus this many new tokens (0: no)")
    ap.add_argument("--work", default="", help="keep the stores and logs here")
    ap.add_argument("--cold", action="store_true",
                    help="drop the page cache before the second and turn-2 processes (root)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the second, link and turn-2 processes this many times, the modes "
                    "interleaved; report the median")
    ap.add_argument("--reuse", action="store_true",
                    help="use the stores an earlier run left in --work (the same model, tokens "
                    "and modes): no first processes")
    ap.add_argument("--turn2-only", action="store_true",
                    help="with --reuse and --turn2-tokens: only the turn-2 processes")
    a = ap.parse_args()
    if a.cold:
        try:
            drop_page_cache()
        except OSError as e:
            ap.error(f"--cold needs root to write /proc/sys/vm/drop_caches: {e}")
    # a 16K prefill step on 2 vCPUs can outlast vLLM's default 300 s step timeout
    os.environ.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "3600")
    # vLLM's CPU worker leaves one core per rank to the scheduler, one more with any KV connector
    # (ompmultiprocessing.py), and none when that is every core: on 2 vCPUs the recompute run
    # would get one core and the connector runs two. Every mode gets the same cores.
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    if a.turn2_only and not (a.reuse and a.turn2_tokens):
        ap.error("--turn2-only needs --reuse and --turn2-tokens")
    if a.link_gbps < 0 or a.turn2_tokens < 0 or a.tokens <= 0 or a.repeat < 1:
        ap.error("--tokens and --repeat must be > 0, --link-gbps and --turn2-tokens >= 0")
    rng = random.Random(0)
    prompt = {"prompt_token_ids": [rng.randrange(100, 40000) for _ in range(a.tokens)]}
    warm = {"prompt_token_ids": [rng.randrange(100, 40000) for _ in range(256)]}
    turn2 = {"prompt_token_ids": prompt["prompt_token_ids"] +
             [rng.randrange(100, 40000) for _ in range(a.turn2_tokens)]}
    work = Path(a.work or tempfile.mkdtemp(prefix="tqkv-bench-vllm-"))
    work.mkdir(parents=True, exist_ok=True)
    max_len = a.tokens + a.turn2_tokens + 64
    results = {"model": a.model, "tokens": a.tokens, "cpu_count": os.cpu_count(),
               "link_gbps": a.link_gbps or None, "turn2_tokens": a.turn2_tokens or None,
               "cold": a.cold, "repeat": a.repeat, "modes": {}}
    modes = a.modes.split(",")
    stores = {m: work / f"store-{m.replace('@', '-c')}" for m in modes}
    conns = {m: connector(m, stores[m], 0) for m in modes}
    res = {m: {} for m in modes}
    for mode in modes:  # turn 1: each mode's first process stores the prompt
        store, conn = stores[mode], conns[mode]
        snap = work / f"{store.name}.turn1"
        if a.reuse and conn and store.exists():
            if snap.exists():  # turn 2 of the earlier run wrote to it
                shutil.rmtree(store)
                shutil.copytree(snap, store)
            elif a.turn2_tokens:
                sys.exit(f"bench_vllm: --reuse: no {snap}, so {store} may hold an earlier turn "
                         "2's chunks (a turn 2 would restore them); run without --turn2-tokens")
            res[mode]["first_process_s"] = None
        else:
            shutil.rmtree(store, ignore_errors=True)
            if mode == "example":
                store.mkdir()
            first = serve(a.model, [prompt], conn, work, f"{mode}-first", max_len) if conn \
                else None
            res[mode]["first_process_s"] = None if first is None else round(first["seconds"], 3)
        res[mode]["stored_bytes"] = du(store)
    # the returning user, --repeat rounds with the modes interleaved (the load changes by the
    # minute on a shared machine), then through the link
    second = {m: [] for m in modes}
    linked = {m: [] for m in modes if a.link_gbps and conns[m] and m != "example"}
    for i in range(0 if a.turn2_only else a.repeat):
        for mode in modes:
            second[mode].append(ttft(serve(a.model, [warm, prompt], conns[mode], work,
                                           f"{mode}-second{i or ''}", max_len, a.cold)))
    for i in range(0 if a.turn2_only else a.repeat):
        for mode in linked:
            conn = connector(mode, stores[mode], a.link_gbps)
            linked[mode].append(ttft(serve(a.model, [warm, prompt], conn, work,
                                           f"{mode}-link{i or ''}", max_len)))
    for mode in modes:
        r = median_run(second[mode]) if second[mode] else {}
        r.update(res[mode])
        if a.link_gbps and mode == "example":
            r["link"] = {"computed_not_measured_read_s":
                         round(r["stored_bytes"] / (a.link_gbps * 1e9), 3)}
        elif linked.get(mode):
            r["link"] = median_run(linked[mode])
        res[mode] = r
    # turn 2 writes its new chunks: each tqkv repeat starts from turn 1's store again;
    # ExampleConnector (a miss: it keys whole prompts) and recompute run once
    t2 = {m: [] for m in modes}
    for i in range(a.repeat if a.turn2_tokens else 0):
        for mode in modes:
            store, conn = stores[mode], conns[mode]
            if i and mode in ("example", "recompute"):
                continue
            snap = work / f"{store.name}.turn1"
            if conn and i == 0:
                shutil.rmtree(snap, ignore_errors=True)
                shutil.copytree(store, snap)
            elif conn:
                shutil.rmtree(store)
                shutil.copytree(snap, store)
            before = du(store)
            t2[mode].append(ttft(serve(a.model, [warm, turn2], conn, work,
                                       f"{mode}-turn2{i or ''}", max_len, a.cold and bool(conn))))
            if conn:
                t2[mode][-1]["bytes_written"] = du(store) - before
    for mode in modes:
        if t2[mode]:
            res[mode]["turn2"] = median_run(t2[mode])
        results["modes"][mode] = res[mode]
        log(json.dumps({mode: res[mode]}))
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`tqkv-bench migrate` through llama.cpp: does a sequence that went through a codec, a store and a fresh
context in another process continue as the uncompressed original does? (docs/llama.md)

    python3 lab/llama_migrate.py --model M.gguf --prompt-file /usr/share/common-licenses/GPL-3 \\
        --tokens 2048 --steps 50 --codecs fp16,tq3,tq4 --store /tmp/store --json out.json

1. Prefill the first N prompt tokens in one context (batches of n_batch), save the sequence
   state; then teacher-force the next `steps` prompt tokens one at a time, recording the logits
   after each (the reference).
2. For each codec: compress the saved state into the store (tqkv.llama.save_blob, in process). A
   worker process (this file with --worker) loads the model, and for each codec a fresh context:
   it loads the session (tqkv.llama.load_sequence), feeds the same tokens one at
   a time and writes the logits. The batch split after the prefix is the reference's, so only the
   cache differs.
3. Compare: top-1 agreement, KL(ref || restored) mean and max, max |logit diff|, and the K/V cosine
   of the restored rows against the original (per vector, mean per layer, then over layers).
4. With --llama-kv q8_0,q5_0,...: llama.cpp's own KV cache types as the yardstick. For each type a
   fresh context with type_k = type_v = that type and flash attention (llama.cpp needs it for a
   quantized V) prefills the same N tokens with the same batches and teacher-forces the same steps;
   plus one control row, f16 with flash attention (--no-f16-control leaves it out). Unlike the
   tqkv rows, the prefill itself runs on the quantized cache there (tqkv compresses a cache
   computed exactly): not the identical experiment.
With --prefill-cache DIR the prefill's products (the saved sequence, the reference logits, the
prompt tokens and llama.cpp's save figures) are kept under a key of the model file, prompt, N,
steps, threads, batch size, flash attention and llama-cpp-python version, and a later run with the
same key reuses them instead of prefilling again (`prefill_cached` in the JSON; CPU llama.cpp is
deterministic, so the rows are those of the same experiment). Each tqkv and llama.cpp row lists
its `flipped_steps`: the steps whose top-1 differs from the reference's, with the reference's
margin between its first and second logit there (`reference_margins` has it for every step): a
flip at a margin of 0.05 is a near-tie, one at 5 is a broken cache.
The JSON (rewritten as each row comes in, so a long run keeps its finished rows; `done_s` is when
a row was written) has the keys of `tqkv-bench migrate` (model, prompt_tokens, steps, results[codec,
top1, kl_mean, kl_max, max_logit_diff, k_cosine_mean, v_cosine_mean]) plus sizes, times and
bits_per_value (.tqkv bytes x 8 / the values it holds: 2 x layers x kv_heads x head_dim x N, less
what the window layers of a sliding-window model do not hold); for llama.cpp's types
the bits of their ggml blocks: q8_0 8.5, q5_0 5.5, q4_1 5.0, q4_0 4.5, f16 16).

A --codecs entry is a codec spec with optional settings, each `@NAME=VALUE` (a ',' inside a value
is written ':', since ',' separates entries): `@km=` is `tqkv llama import --key-means` (off,
session, a block B, optionally :f16 or :f32), `@exact=` is --exact-tokens (FIRST:LAST); both
are the library's settings (tqkv.checkpoint's key_means and exact_tokens). Example:
`--codecs fp16,tq3,tq3@km=off,tq3@exact=4:128,tq4@km=session:f32`. An entry without @exact= gets
`tqkv llama import`'s default (the last 4 tokens exact for lossy codecs; `@exact=0:0` for none);
each row's `exact_tokens` is what its container holds. `--codec ENTRY` (repeatable) adds one entry
whose spec may hold commas (`--codec tq:b=4,nc=1@exact=0:4`); its rows come after --codecs'.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import tqkv
import tqkv.llama as tl


# llama.cpp's KV cache types for --llama-kv: (ggml type id, bits per value of its block layout:
# ggml-common.h block_q8_0 = f16 scale + 32 i8 = 34 bytes per 32 values, q5_0 = f16 + 4 + 16 = 22,
# q4_1 = 2 f16 + 16 = 20, q4_0 = f16 + 16 = 18).
LLAMA_KV_TYPES = {"f16": (1, 16.0), "q8_0": (8, 8.5), "q5_0": (6, 5.5), "q4_1": (3, 5.0),
                  "q4_0": (2, 4.5)}


def parse_entry(entry, default_exact=""):
    """A --codecs entry `SPEC[@km=V][@exact=F:L]` -> (spec, key_means or None, exact_tokens or
    None); ':' inside a value stands for ','."""
    spec, *opts = entry.split("@")
    if not spec:
        raise ValueError(f"codec entry {entry!r}: no codec spec")
    settings = {"km": None, "exact": default_exact or None}
    for opt in opts:
        name, eq, value = opt.partition("=")
        if not eq or name not in settings or not value:
            raise ValueError(f"codec entry {entry!r}: expected @km=VALUE or @exact=FIRST:LAST, "
                             f"got @{opt}")
        settings[name] = value.replace(":", ",")
    return spec, settings["km"], settings["exact"]


def llama_kv_names(arg, no_f16_control=False):
    """The --llama-kv rows in order: the f16 + flash attention control first unless the list
    places it ("f16") or no_f16_control leaves it out (it costs a prefill of its own)."""
    names = [t for t in arg.split(",") if t]
    return names if "f16" in names or no_f16_control else ["f16", *names]


def _open(model, n_ctx, threads, flash_attn, n_batch, kv_type=None):
    import llama_cpp
    extra = {} if kv_type is None else {"type_k": kv_type, "type_v": kv_type}
    return llama_cpp.Llama(model_path=model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                           n_threads=threads, n_threads_batch=threads, flash_attn=flash_attn,
                           verbose=False, **extra)


def _last_logits(llm):
    import llama_cpp
    n_vocab = llm.n_vocab()
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).astype(np.float32).copy()


def llama_cpp_model_int(llm, fn):
    import llama_cpp
    return int(getattr(llama_cpp, fn)(llm._model.model))


def teacher_force(llm, feed):
    out = []
    for t in feed:
        llm.eval([t])
        out.append(_last_logits(llm))
    return np.stack(out)


def _tokenize(llm, path, need):
    with open(path, "rb") as f:
        text = f.read()
    toks = llm.tokenize(text, add_bos=True, special=False)
    if len(toks) < need:
        raise SystemExit(f"{path}: {len(toks)} tokens, need {need} (no text is repeated)")
    return toks[:need]


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# The comparison figures below are defined once with `tqkv-bench migrate`'s (bench/migrate/compare.h);
# tests/python/test_compare.py and tests/model/compare_test.cc pin both to the same numbers.
def _kl(ref, got):
    """Per step, KL(ref || got) of the softmaxes in double, clamped at 0 (rounding)."""
    def logsm(x):
        x = x.astype(np.float64)
        m = x.max(axis=-1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))
    lp, lq = logsm(ref), logsm(got)
    return np.maximum((np.exp(lp) * (lp - lq)).sum(axis=-1), 0.0)


def _margins(ref):
    """Per step, the reference's top-1 logit minus its top-2 logit."""
    top2 = np.sort(ref, axis=-1)[:, -2:].astype(np.float64)
    return top2[:, 1] - top2[:, 0]


def _flips(ref, got):
    """The steps whose top-1 differs from the reference's, with the reference's margin there."""
    margins = _margins(ref)
    r, g = ref.argmax(-1), got.argmax(-1)
    return [{"step": int(i), "ref_top1": int(r[i]), "got_top1": int(g[i]),
             "ref_margin": round(float(margins[i]), 4)} for i in np.nonzero(r != g)[0]]


def _stored_exact_tokens(store, key):
    """The container's exact rows as "FIRST,LAST" ("" for none): what the entry asked for, or
    the library's default where it asked for nothing."""
    et = store.inspect(key)["exact_tokens"]
    return f"{et['first']},{et['last']}" if et["first"] or et["last"] else ""


def _prefill_key(args):
    """What the prefill's products depend on: the model's bytes, the prompt's, N, steps, threads,
    batches, flash attention and the engine's version."""
    import llama_cpp
    h = hashlib.sha256()
    for path in (args.model, args.prompt_file):
        h.update(_sha256(path).encode())
    h.update(json.dumps([args.tokens, args.steps, args.threads, args.n_batch, args.flash_attn,
                         llama_cpp.__version__]).encode())
    return h.hexdigest()[:24]


def _read_prefill(cache, prompt):
    """A cached prefill: (state blob, reference logits, meta); its prompt must be this run's."""
    with open(os.path.join(cache, "meta.json")) as f:
        meta = json.load(f)
    if meta["prompt"] != prompt:
        raise SystemExit(f"{cache}: cached prompt tokens differ from this run's")
    with open(os.path.join(cache, "state.bin"), "rb") as f:
        blob = f.read()
    return blob, np.load(os.path.join(cache, "ref.npy")), meta


def _write_prefill(cache, blob, ref, meta):
    """Writes a prefill's products into cache + ".part", then renames it into place: a run killed
    half-way leaves no cache entry that a later run would trust."""
    part = cache + ".part"
    os.makedirs(part, exist_ok=True)
    with open(os.path.join(part, "state.bin"), "wb") as f:
        f.write(blob)
    np.save(os.path.join(part, "ref.npy"), ref)
    with open(os.path.join(part, "meta.json"), "w") as f:
        json.dump(meta, f)
    shutil.rmtree(cache, ignore_errors=True)
    os.replace(part, cache)


def _decompress_cli(path, tmp):
    """{"layers.L.k"/"layers.L.v": [n_l, heads, head_dim] float32} of a .tqkv file, through
    `tqkv decompress` (format.md section 12), for sessions whose layers hold different counts."""
    out = os.path.join(tmp, "decompressed.safetensors")
    subprocess.run([os.environ.get("TQKV_CLI", "tqkv"), "decompress", path, out, "--dtype", "f32"],
                   check=True, stdout=subprocess.DEVNULL)
    with open(out, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    os.unlink(out)
    return {name: np.frombuffer(data[t["data_offsets"][0]:t["data_offsets"][1]],
                                dtype=np.float32).reshape(t["shape"])
            for name, t in header.items() if name != "__metadata__"}


def _mean_cosine(a, b):
    """Mean cos(a, b) over the vectors (last axis) in double; vectors whose reference is zero
    (rows a sliding-window cache lacks) are left out, a zero restored vector counts 0, and no
    vector left gives 1."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    na, nb = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)
    live = na > 0
    if not live.any():
        return 1.0
    cos = (a * b).sum(-1)[live] / np.maximum(na[live] * nb[live], 1e-300)
    return float(cos.mean())


def _cosines(ref, got):
    """Mean over layers of the per-layer _mean_cosine of every (token, head) vector."""
    means = {"k": [], "v": []}
    layers = sorted({int(n.split(".")[1]) for n in ref})
    for kv in ("k", "v"):
        for l in layers:
            means[kv].append(_mean_cosine(ref[f"layers.{l}.{kv}"], got[f"layers.{l}.{kv}"]))
    return float(np.mean(means["k"])), float(np.mean(means["v"]))


def _worker(spec_path):
    with open(spec_path) as f:
        spec = json.load(f)
    for job in spec["jobs"]:
        llm = _open(spec["model"], spec["n_ctx"], spec["threads"], spec["flash_attn"], spec["n_batch"])
        t0 = time.perf_counter()
        tl.load_sequence(llm, spec["store"], job["key"])
        load_s = time.perf_counter() - t0
        logits = teacher_force(llm, spec["feed"])
        np.save(job["logits"], logits)
        with open(job["logits"] + ".json.part", "w") as f:  # written last: the row is complete
            json.dump({"load_s": load_s}, f)
        os.replace(job["logits"] + ".json.part", job["logits"] + ".json")
        del llm


def _llama_kv_rows(args, n_ctx, prompt, ref, emit, t_start):
    """The --llama-kv rows: llama.cpp's own cache types, prefilled and teacher-forced in-process."""
    rows = []
    for name in llama_kv_names(args.llama_kv, args.no_f16_control):
        ggml_type, bits = LLAMA_KV_TYPES[name]
        t0 = time.perf_counter()
        llm = _open(args.model, n_ctx, args.threads, True, args.n_batch, kv_type=ggml_type)
        llm.eval(prompt[:args.tokens])
        prefill_s = time.perf_counter() - t0
        state_bytes = len(tl.get_sequence_state(llm, 0))
        got = teacher_force(llm, prompt[args.tokens:args.tokens + args.steps])
        del llm
        kl = _kl(ref, got)
        rows.append({
            "codec": f"llama.cpp {name}" + (" + flash attention" if name == "f16" else ""),
            "kind": "llama.cpp", "llama_kv_type": name, "flash_attn": True,
            "top1": int((ref.argmax(-1) == got.argmax(-1)).sum()),
            "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "max_logit_diff": float(np.abs(ref - got).max()), "flipped_steps": _flips(ref, got),
            "bits_per_value": bits, "state_bytes": state_bytes, "prefill_s": prefill_s,
            "done_s": time.perf_counter() - t_start,
        })
        emit(rows)
    return rows


def entries_of(args):
    """--codecs' comma-separated entries, then each --codec entry whole (its spec may hold ',')."""
    return [c for c in args.codecs.split(",") if c] + args.codec


def run(args, emit=lambda report: None):
    entries = entries_of(args)
    settings = {c: parse_entry(c, args.exact_tokens) for c in entries}
    codecs = entries
    n, steps = args.tokens, args.steps
    n_ctx = n + steps + 16
    store = tqkv.open_store(args.store)
    tqkv.set_num_threads(args.threads)
    t_start = time.perf_counter()
    load_start = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())

    llm = _open(args.model, n_ctx, args.threads, args.flash_attn, args.n_batch)
    prompt = _tokenize(llm, args.prompt_file, n + steps)
    head_dim = tl.head_dim_of(llm)
    n_layer = llama_cpp_model_int(llm, "llama_model_n_layer")
    n_head_kv = llama_cpp_model_int(llm, "llama_model_n_head_kv")
    values = 2 * n_layer * n_head_kv * head_dim * n
    tmp = tempfile.mkdtemp(prefix="llama_migrate_")
    feed = prompt[n:n + steps]
    import llama_cpp
    cache, cached_hit = None, False
    if args.prefill_cache:
        cache = os.path.join(args.prefill_cache, _prefill_key(args))
    if cache and os.path.exists(os.path.join(cache, "meta.json")):
        cached_hit = True
        blob, ref, meta = _read_prefill(cache, prompt)
        prefill_s, llama_save_s, slot_bytes = meta["prefill_s"], meta["llama_save_s"], meta["slot_bytes"]
        del llm
    else:
        t0 = time.perf_counter()
        llm.eval(prompt[:n])
        prefill_s = time.perf_counter() - t0
        blob = tl.get_sequence_state(llm, 0)
        # llama.cpp's own save, for the size and time figures.
        slot_path = os.path.join(tmp, "slot.bin")
        t0 = time.perf_counter()
        arr = (llama_cpp.llama_token * n)(*prompt[:n])
        llama_cpp.llama_state_seq_save_file(llm._ctx.ctx, slot_path.encode(), 0, arr, n)
        llama_save_s = time.perf_counter() - t0
        slot_bytes = os.path.getsize(slot_path)
        ref = teacher_force(llm, feed)
        del llm
        if cache:
            _write_prefill(cache, blob, ref, {"prompt": prompt, "prefill_s": prefill_s,
                                              "llama_save_s": llama_save_s,
                                              "slot_bytes": slot_bytes})

    jobs, saves = [], {}
    fp16_key = "llama-migrate-fp16-ref"
    keys = {}
    for codec in [*codecs, "__ref__"]:
        spec, key_means, exact = ("fp16", None, None) if codec == "__ref__" else settings[codec]
        key = fp16_key if codec == "__ref__" else f"llama-migrate-{len(keys)}"
        t0 = time.perf_counter()
        tl.save_blob(blob, store, key, head_dim, prompt[:n], codec=spec,
                     exact_tokens=None if exact is None else tuple(map(int, exact.split(","))),
                     key_means=key_means, model=os.path.basename(args.model))
        saves[codec] = time.perf_counter() - t0
        keys[codec] = key
        if codec != "__ref__":
            jobs.append({"codec": codec, "key": key, "logits": os.path.join(tmp, f"{key}.npy")})
    spec_path = os.path.join(tmp, "spec.json")
    with open(spec_path, "w") as f:
        json.dump({"model": args.model, "n_ctx": n_ctx, "threads": args.threads,
                   "flash_attn": args.flash_attn, "n_batch": args.n_batch, "store": args.store,
                   "feed": feed, "jobs": jobs}, f)
    worker = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", spec_path])

    def decompress(key):
        try:
            k, v = tqkv.restore(store, key, dtype="float32")
        except tqkv.UnsupportedError:  # ragged layers (a sliding-window model): tqkv decompress
            return _decompress_cli(os.path.join(args.store, key + ".tqkv"), tmp)
        return {f"layers.{l}.{kv}": t[l] for kv, t in (("k", k), ("v", v)) for l in range(len(k))}

    report = {
        "engine": "llama.cpp (llama-cpp-python " + llama_cpp.__version__ + ")",
        "model": os.path.basename(args.model), "prompt_file": args.prompt_file,
        "prompt_sha256": _sha256(args.prompt_file),
        "prompt_tokens": n, "steps": steps, "head_dim": head_dim, "flash_attn": args.flash_attn,
        "threads": args.threads, "n_batch": args.n_batch,
        "state_bytes": len(blob), "slot_file_bytes": slot_bytes,
        "llama_save_file_s": llama_save_s, "prefill_s": prefill_s,
        "prefill_cached": cached_hit,
        "exact_tokens": args.exact_tokens or "",
        "n_layer": n_layer, "n_head_kv": n_head_kv, "started": started,
        # Runs of the same model, prompt, N, threads and batches give the same reference (CPU
        # llama.cpp is deterministic); the hash lets rows of two runs be compared.
        "reference_logits_sha256": hashlib.sha256(np.ascontiguousarray(ref).tobytes()).hexdigest(),
        "reference_margins": [round(float(m), 4) for m in _margins(ref)],
        "loadavg_start": list(load_start), "results": [],
    }
    results = []

    def report_now(kv_rows=()):
        report["results"] = results + list(kv_rows)
        report["wall_s"] = time.perf_counter() - t_start
        report["loadavg_end"] = list(os.getloadavg())
        emit(report)

    ref_kv = decompress(fp16_key)
    for job in jobs:  # each row is written as soon as the worker has its logits (long runs)
        while not os.path.exists(job["logits"] + ".json"):
            if worker.poll() is not None and not os.path.exists(job["logits"] + ".json"):
                raise SystemExit(f"llama_migrate worker exited with {worker.returncode} "
                                 f"before {job['codec']}")
            time.sleep(1)
        got = np.load(job["logits"])
        with open(job["logits"] + ".json") as f:
            load_s = json.load(f)["load_s"]
        kl = _kl(ref, got)
        kc, vc = _cosines(ref_kv, decompress(job["key"]))
        size = store.size(job["key"])
        spec, key_means, exact = settings[job["codec"]]
        results.append({
            "codec": job["codec"], "kind": "tqkv", "spec": spec,
            "key_means": key_means or "default",
            "exact_tokens": _stored_exact_tokens(store, job["key"]),
            # the values the session holds: a sliding-window layer holds its window (ragged)
            "bits_per_value": size * 8 / (store.inspect(job["key"])["fp16_bytes"] / 2),
            "top1": int((ref.argmax(-1) == got.argmax(-1)).sum()),
            "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "max_logit_diff": float(np.abs(ref - got).max()), "flipped_steps": _flips(ref, got),
            "k_cosine_mean": kc, "v_cosine_mean": vc,
            "tqkv_bytes": size, "save_s": saves[job["codec"]], "load_s": load_s,
            "done_s": time.perf_counter() - t_start,  # seconds into the run when it was written
        })
        report_now()
    if worker.wait() != 0:
        raise SystemExit(f"llama_migrate worker exited with {worker.returncode}")

    report_now()  # the tqkv rows are written before the (slow) llama.cpp rows start
    if args.llama_kv:
        report_now(_llama_kv_rows(args, n_ctx, prompt, ref, report_now, t_start))
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)  # the slot file, the logits, the worker's spec
        for key in keys.values():
            try:
                store.rm(key)
            except FileNotFoundError:
                pass
    return report


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--model")
    p.add_argument("--prompt-file")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--codecs", default="fp16,tq3,tq4",
                   help="entries SPEC[@km=V][@exact=F:L], comma-separated (see the top of this file)")
    p.add_argument("--codec", action="append", default=[], metavar="ENTRY",
                   help="one more entry, taken whole: its spec may hold commas (tq:b=4,nc=1)")
    p.add_argument("--exact-tokens", default="", help="FIRST,LAST for every entry without @exact")
    p.add_argument("--llama-kv", default="",
                   help="also llama.cpp's own KV types, e.g. q8_0,q5_0,q4_1,q4_0 (flash attention; "
                        "plus an f16 + flash attention control row, first unless listed as f16)")
    p.add_argument("--no-f16-control", action="store_true",
                   help="with --llama-kv: leave out the f16 + flash attention control row (one "
                        "prefill less; for a second run of a prompt whose control is measured)")
    p.add_argument("--store", default=None)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--n-batch", type=int, default=512)
    p.add_argument("--flash-attn", action="store_true")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--prefill-cache", default=None,
                   help="a directory keeping each prefill's state and reference logits for reuse")
    p.add_argument("--json", default="-")
    args = p.parse_args(argv)
    if args.worker:
        _worker(args.worker)
        return 0
    if not args.model or not args.prompt_file:
        p.error("--model and --prompt-file are required")
    own_store = args.store is None
    if own_store:
        args.store = tempfile.mkdtemp(prefix="llama_migrate_store_")
    for c in entries_of(args):
        try:
            parse_entry(c)
        except ValueError as e:
            p.error(str(e))
    for t in args.llama_kv.split(","):
        if t and t not in LLAMA_KV_TYPES:
            p.error(f"--llama-kv: unknown type {t} (know {', '.join(LLAMA_KV_TYPES)})")

    def write(report):  # a file is rewritten as rows come in, so a long run keeps what it measured
        if args.json != "-":
            with open(args.json + ".part", "w") as f:
                f.write(json.dumps(report, indent=2, sort_keys=True) + "\n")
            os.replace(args.json + ".part", args.json)

    report = run(args, write)
    if own_store and not args.keep:
        shutil.rmtree(args.store, ignore_errors=True)
    if args.json == "-":
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        write(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

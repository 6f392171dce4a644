"""lab/llama_migrate.py's comparison settings (docs/lab/accuracy-log.md, "Through llama.cpp"): --codecs
entries with @km= / @exact= reach the library's key_means / exact_tokens settings, and
--llama-kv adds llama.cpp's own KV cache types (and the f16 + flash attention control) measured
with the same teacher-forced protocol. Real llama.cpp on SmolLM2, a short run.

    llama_migrate_test.py        (run by ctest as llama.migrate, PYTHONPATH=<build>/python)

Exits 77 (ctest: skipped), saying why, without llama_cpp or the tqkv package, without SmolLM2
(scripts/fetch_smollm2.sh) or with TQKV_SKIP_LLAMA=1.
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CACHE = os.environ.get("TQKV_CACHE_DIR", os.path.expanduser("~/.cache/tqkv"))
PROMPT = "/usr/share/common-licenses/GPL-3"
# One llama.cpp thread: ggml's threads spin at their barriers, and scripts/test.sh runs these
# beside other lanes on the same cores (Gemma engine tests with one busy core beside them:
# 2 threads 53 s, 1 thread 42 s; idle 27 and 36 s).
THREADS = 1
SMOLLM2 = os.environ.get("TQKV_SMOLLM2_GGUF") or os.path.join(CACHE, "SmolLM2-135M-Instruct.Q4_1.gguf")
MIGRATE = os.path.join(REPO, "lab/llama_migrate.py")


def load_migrate():
    spec = importlib.util.spec_from_file_location("tqkv_llama_migrate", MIGRATE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Entries(unittest.TestCase):
    def test_entry_grammar(self):
        m = load_migrate()
        self.assertEqual(m.parse_entry("tq3"), ("tq3", None, None))
        self.assertEqual(m.parse_entry("tq3@km=off"), ("tq3", "off", None))
        self.assertEqual(m.parse_entry("tq4@km=64:f32"), ("tq4", "64,f32", None))
        self.assertEqual(m.parse_entry("tq3@exact=4:128@km=session"), ("tq3", "session", "4,128"))
        self.assertEqual(m.parse_entry("tq3", "4,16"), ("tq3", None, "4,16"))
        self.assertEqual(m.parse_entry("tq3@exact=0:8", "4,16"), ("tq3", None, "0,8"))
        for bad in ("tq3@km", "tq3@km=", "tq3@bits=3", "@km=off", "tq3@"):
            with self.assertRaises(ValueError, msg=bad):
                m.parse_entry(bad)

    def test_codec_entries_keep_their_commas(self):
        m = load_migrate()
        args = m.argparse.Namespace(codecs="tq3,tq4", codec=["tq:b=4,nc=1@exact=0:4"])
        self.assertEqual(m.entries_of(args), ["tq3", "tq4", "tq:b=4,nc=1@exact=0:4"])
        self.assertEqual(m.parse_entry(m.entries_of(args)[2]), ("tq:b=4,nc=1", None, "0,4"))

    def test_llama_kv_order_and_the_control(self):
        m = load_migrate()
        self.assertEqual(m.llama_kv_names("q4_0,q5_0"), ["f16", "q4_0", "q5_0"])
        self.assertEqual(m.llama_kv_names("q4_0,f16,q5_0"), ["q4_0", "f16", "q5_0"])
        self.assertEqual(m.llama_kv_names("q4_0,q5_0", no_f16_control=True), ["q4_0", "q5_0"])
        self.assertEqual(m.llama_kv_names("q4_0,f16", no_f16_control=True), ["q4_0", "f16"])
        self.assertEqual(m.llama_kv_names(""), ["f16"])

    def test_flips_name_the_steps_and_the_reference_margin(self):
        import numpy as np
        m = load_migrate()
        ref = np.array([[0.0, 3.0, 1.0], [2.0, 1.9, 0.0], [0.0, 0.0, 5.0]], dtype=np.float32)
        got = np.array([[0.0, 3.0, 1.0], [1.0, 2.0, 0.0], [6.0, 0.0, 5.0]], dtype=np.float32)
        np.testing.assert_allclose(m._margins(ref), [2.0, 0.1, 5.0], rtol=1e-6)
        flips = m._flips(ref, got)
        self.assertEqual([(f["step"], f["ref_top1"], f["got_top1"]) for f in flips],
                         [(1, 0, 1), (2, 2, 0)])
        self.assertAlmostEqual(flips[0]["ref_margin"], 0.1, places=4)
        self.assertEqual(m._flips(ref, ref), [])

    def test_bad_entry_and_kv_type_are_refused_before_any_work(self):
        for flag, value in (("--codecs", "tq3@kmeans=off"), ("--llama-kv", "q4_0,q3_k"),
                            ("--codec", "tq:b=4,nc=1@kmeans=off")):
            p = subprocess.run([sys.executable, MIGRATE, "--model", "x.gguf", "--prompt-file",
                                PROMPT, flag, value], capture_output=True, text=True)
            self.assertEqual(p.returncode, 2, p.stderr)  # argparse's usage error, no traceback
            self.assertIn(value.split(",")[-1].replace("tq3", ""), p.stderr)


class Engine(unittest.TestCase):
    def test_smollm2_key_means_exact_tokens_and_llama_kv(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "m.json")
            subprocess.run([sys.executable, MIGRATE, "--model", SMOLLM2, "--prompt-file", PROMPT,
                            "--tokens", "160", "--steps", "12", "--threads", str(THREADS),
                            "--codecs", "fp16,tq3,tq3@km=off,tq3@km=session,tq3@exact=4:16",
                            "--llama-kv", "q8_0,q4_0", "--store", os.path.join(d, "store"),
                            "--prefill-cache", os.path.join(d, "prefill"), "--json", out],
                           check=True)
            with open(out) as f:
                r = json.load(f)
            # A second run reuses the first's prefill and reference: the same rows, no prefill.
            subprocess.run([sys.executable, MIGRATE, "--model", SMOLLM2, "--prompt-file", PROMPT,
                            "--tokens", "160", "--steps", "12", "--threads", str(THREADS),
                            "--codecs", "tq3", "--prefill-cache", os.path.join(d, "prefill"),
                            "--json", out], check=True)
            with open(out) as f:
                again = json.load(f)
        self.assertFalse(r["prefill_cached"])
        self.assertTrue(again["prefill_cached"])
        self.assertEqual(again["reference_logits_sha256"], r["reference_logits_sha256"])
        self.assertEqual(again["state_bytes"], r["state_bytes"])
        self.assertEqual(len(r["reference_margins"]), 12)
        rows = {x["codec"]: x for x in r["results"]}
        for x in r["results"]:
            print(json.dumps({k: x.get(k) for k in ("codec", "top1", "kl_mean", "bits_per_value",
                                                    "tqkv_bytes")}))
        self.assertEqual(list(rows), ["fp16", "tq3", "tq3@km=off", "tq3@km=session",
                                      "tq3@exact=4:16", "llama.cpp f16 + flash attention",
                                      "llama.cpp q8_0", "llama.cpp q4_0"])
        values = 2 * r["n_layer"] * r["n_head_kv"] * r["head_dim"] * 160
        self.assertEqual(values, 2 * 30 * 3 * 64 * 160)  # SmolLM2-135M: 30 layers, 3 KV heads
        done = [x["done_s"] for x in r["results"]]  # rows are written as they come in
        self.assertEqual(done, sorted(done))
        self.assertLessEqual(done[-1], r["wall_s"])
        for x in r["results"]:
            if x["kind"] == "tqkv":
                self.assertAlmostEqual(x["bits_per_value"], x["tqkv_bytes"] * 8 / values)
        # The settings reached the container: key means cost bytes, exact tokens more, and each
        # setting gives other codes (at N = 160 a session mean and two 128-token block means round
        # to the same 4 KiB-aligned size, so their KL tells them apart).
        self.assertEqual(again["results"][0]["kl_mean"], rows["tq3"]["kl_mean"])
        for x in r["results"]:
            self.assertEqual(len(x["flipped_steps"]), 12 - x["top1"], x["codec"])
            for f in x["flipped_steps"]:
                self.assertEqual(f["ref_margin"], r["reference_margins"][f["step"]])
        off, default, session = rows["tq3@km=off"], rows["tq3"], rows["tq3@km=session"]
        # The rows record the exact rows their containers hold: `tqkv llama import`'s default
        # for lossy codecs (the last 4 tokens), none for fp16, or what @exact= asked for.
        self.assertEqual([rows[c]["exact_tokens"] for c in ("fp16", "tq3", "tq3@exact=4:16")],
                         ["", "0,4", "4,16"])
        self.assertEqual((off["key_means"], session["key_means"]), ("off", "session"))
        self.assertLess(off["tqkv_bytes"], session["tqkv_bytes"])
        self.assertLessEqual(session["tqkv_bytes"], default["tqkv_bytes"])
        self.assertGreater(rows["tq3@exact=4:16"]["tqkv_bytes"], default["tqkv_bytes"])
        self.assertEqual(len({off["kl_mean"], default["kl_mean"], session["kl_mean"]}), 3)
        # llama.cpp's own types: the control is close to the reference (flash attention reorders
        # the sums only), q8_0 closer than q4_0, each with its block's bits.
        fa, q8, q4 = (rows["llama.cpp f16 + flash attention"], rows["llama.cpp q8_0"],
                      rows["llama.cpp q4_0"])
        self.assertEqual((fa["bits_per_value"], q8["bits_per_value"], q4["bits_per_value"]),
                         (16.0, 8.5, 4.5))
        self.assertLess(fa["kl_mean"], 0.01)
        self.assertGreater(q4["kl_mean"], fa["kl_mean"])
        self.assertLess(q8["kl_mean"], q4["kl_mean"])
        self.assertLess(q8["state_bytes"], fa["state_bytes"] * 0.6)  # the blob holds q8_0 rows
        self.assertGreaterEqual(q8["top1"], 9)


if __name__ == "__main__":
    why = None
    if os.environ.get("TQKV_SKIP_LLAMA"):
        why = "TQKV_SKIP_LLAMA is set"
    else:
        try:
            import llama_cpp  # noqa: F401
        except ImportError as e:
            why = f"llama_cpp not importable ({e}); build it with scripts/build-llama-wheel.sh VENV"
        try:
            import tqkv  # noqa: F401
        except ImportError as e:
            why = why or f"the tqkv package is not importable ({e}): PYTHONPATH=<build>/python"
        if why is None and not os.path.isfile(SMOLLM2):
            why = "SmolLM2 not found (run scripts/fetch_smollm2.sh)"
    if why:
        print(f"llama.cpp tests skipped: {why}")
        sys.exit(77)
    unittest.main(verbosity=2)

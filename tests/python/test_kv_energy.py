"""lab/kv_energy.py on a session whose keys share a dominant vector: the shared fraction is
measured, plain tq3's error relative to the varying part is large and the centered one small."""
import json
import subprocess
import sys

import numpy as np

import tqkv
from conftest import REPO


def test_shared_keys_show_up_and_centering_fixes_them(cli, tmp_path):
    rng = np.random.default_rng(3)
    layers, tokens, heads, dim = 2, 256, 2, 64
    k = rng.standard_normal((layers, tokens, heads, dim)).astype(np.float16)
    k[0] += np.float16(40.0) * np.sign(rng.standard_normal((1, heads, dim))).astype(np.float16)
    v = rng.standard_normal((layers, tokens, heads, dim)).astype(np.float16)
    tqkv.checkpoint(str(tmp_path / "kv"), "s", k, v, codec="fp16")
    out = tmp_path / "e.json"
    r = subprocess.run([sys.executable, str(REPO / "lab" / "kv_energy.py"),
                        str(tmp_path / "kv" / "s.tqkv"), "--codec", "tq3", "--tqkv", cli,
                        "--json", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = {(x["layer"], x["tensor"]): x for x in json.load(open(out))["rows"]}
    assert len(rows) == 2 * layers
    shared0 = rows[(0, "K")]
    assert shared0["shared"] > 0.99  # 40² per channel against 1
    assert rows[(1, "K")]["shared"] < 0.1
    assert shared0["tq3"] > 1.0  # the error swamps the varying part
    assert shared0["tq3+km"] < 0.05
    assert "tq3+km" not in rows[(0, "V")]  # values are never centered
    assert "| 0 | K |" in r.stdout

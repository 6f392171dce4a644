"""lab/llama_migrate.py's comparison figures against the cases that tests/model/compare_test.cc
holds `tqkv-bench migrate` (bench/migrate/compare.h) to: one definition of top-1, KL, margins and
cosines in two languages."""
import importlib.util
import json

import numpy as np
import pytest

from conftest import REPO

CASES = json.loads((REPO / "tests" / "data" / "compare_cases.json").read_text())


@pytest.fixture(scope="module")
def runner():
    spec = importlib.util.spec_from_file_location("llama_migrate", REPO / "lab" / "llama_migrate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # llama_cpp is imported only where a model runs
    return mod


def test_logit_figures(runner):
    c = CASES["logits"]
    shape = (c["steps"], c["vocab"])
    ref = np.array(c["ref"], np.float32).reshape(shape)
    got = np.array(c["got"], np.float32).reshape(shape)
    kl = runner._kl(ref, got)
    assert int((ref.argmax(-1) == got.argmax(-1)).sum()) == c["top1"]
    assert [f["step"] for f in runner._flips(ref, got)] == c["disagree"]
    np.testing.assert_allclose(kl, c["kl"], rtol=0, atol=1e-12)
    assert kl.min() >= 0  # clamped, as in C++
    assert runner._margins(ref).tolist() == c["margins"]


@pytest.mark.parametrize("name", ["cosine", "cosine_empty"])
def test_cosines(runner, name):
    c = CASES[name]
    shape = (c["vectors"], c["dim"])
    ref = np.array(c["ref"], np.float32).reshape(shape)
    got = np.array(c["got"], np.float32).reshape(shape)
    assert runner._mean_cosine(ref, got) == pytest.approx(c["mean"], abs=1e-12)

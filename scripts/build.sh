#!/usr/bin/env bash
# Configures and builds into build/ (RelWithDebInfo: -O2 -g1), through ccache when it is installed
# (scripts/ccache-env.sh). Extra args go to cmake;
# TQKV_BUILD_TARGETS (e.g. "tqkv_cli") builds only those targets (default: all, tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ccache-env.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
# shellcheck disable=SC2086  # a list of target names
ninja -C build ${TQKV_BUILD_TARGETS:-}

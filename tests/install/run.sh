#!/usr/bin/env bash
# Installs the built tree into a scratch prefix (checks the programs are there) and builds + runs a
# find_package(tqkv) consumer.
set -euo pipefail
build_dir="$1"
src_dir="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
# Both programs go to bin/ (tqkv-bench beside tqkv, as db_bench; docs/architecture.md §0).
if [ -x "$build_dir/tqkv" ]; then
  for p in tqkv tqkv-bench; do
    [ -x "$work/prefix/bin/$p" ] || { echo "not installed: bin/$p" >&2; exit 1; }
  done
fi
cmake -S "$src_dir/consumer" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
"$work/build/consumer"

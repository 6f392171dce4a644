#!/usr/bin/env bash
# The main job on the embedded default: install what is missing, build, run the benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
mkdir -p out
./build/tqkv bench codec --json out/bench_codec.json
echo "results: out/bench_codec.json"

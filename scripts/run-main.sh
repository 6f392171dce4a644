#!/usr/bin/env bash
# The main job on the embedded default: install what is missing, build, then a reduced
# `tqkv bench restore` (4 concurrent workers, qwen2.5-7b sessions of 2K-10K tokens, fp16 vs tq3,
# buffered vs direct I/O) on a local directory store. A few minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
mkdir -p out
./build/tqkv bench restore --workers 4 --tokens 2000,5000,10000 --codec fp16 --codec tq3 \
  --io buffered --io direct --store out/bench-store \
  --json out/bench_restore.json --csv out/bench_restore.csv --chart out/bench_restore.svg

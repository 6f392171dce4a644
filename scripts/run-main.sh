#!/usr/bin/env bash
# The main job on the embedded default: install what is missing, build, then a reduced
# `tqkv-bench restore`: 4 concurrent workers, qwen2.5-7b sessions of 2K-10K tokens, fp16 (buffered
# I/O) vs tq3 (direct I/O), on a local directory store, first on the raw disk and then
# through an emulated 0.05 GB/s link per worker (slow enough that the link, not 2 cores' decode,
# limits tq3: 4 x 0.05 x 4.92 = 1 GB/s fp16-eq of decode). A few minutes on 2 cores. The summary
# at the end says per context length how much faster tq3 restores than fp16 and why. fp16 with
# direct I/O against the disk's own speed: scripts/bench-io.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
TQKV_BUILD_TARGETS=tqkv_bench bash scripts/build.sh  # the main job needs the benchmark program only
mkdir -p out
./build/tqkv-bench restore --workers 4 --tokens 2000,5000,10000 \
  --config fp16:buffered --config tq3:direct --link-gbps 0,0.05 \
  --store out/bench-store --json out/bench_restore.json --csv out/bench_restore.csv \
  --chart out/bench_restore.svg

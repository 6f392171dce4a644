#!/usr/bin/env bash
# One-call GPU check for issue 6 (docs/gpu.md §6): build with CUDA for sm_90, run the gpu,
# gpu_ladder and bench tests, the GPU codec benchmark (tq3 decode vs same-run D2D copy),
# `tqkv-bench restore` with the GPU rows (fp16 buffered into the GPU vs tq3 through the GDS ladder
# and direct, 50,000-token qwen2.5-7b sessions, 2 concurrent workers), and one session restored
# into GPU memory through each I/O path. Everything lands in $OUT (JSON + logs); the script never
# stops at the first failure, it records each step's exit code. Budget: about 8 minutes.
#
#   OUT=/some/dir scripts/gpu_check.sh          # on the device machine, from the repo root
set -u
OUT=${OUT:-$PWD/gpu-check-out}
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
STORE=${STORE:-/var/tmp/tqkv-gpu-store}
mkdir -p "$OUT"
STEPS="$OUT/steps.txt"
: > "$STEPS"
step() {  # step NAME CMD...: runs CMD, logs to $OUT/NAME.log, records the exit code
  local name=$1; shift
  local t0=$(date +%s.%N)
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b-a}')" | tee -a "$STEPS"
  return $rc
}

step env bash -c 'nvidia-smi; nvcc --version; uname -a; nproc; free -g; df -h /var/tmp /tmp; findmnt -T /var/tmp'
step configure cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTQKV_ENABLE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DTQKV_ENABLE_REDIS=OFF -DTQKV_ENABLE_NFS=OFF
step build ninja -C "$BUILD" -j "$JOBS" tqkv_cli tqkv_bench tqkv_gpu_tests tqkv_gpu_ladder_tests \
  tqkv_bench_tests || {
  echo "build failed; see $OUT/build.log" | tee -a "$STEPS"; exit 1; }
TQKV="$BUILD/tqkv" TQKV_BENCH="$BUILD/tqkv-bench"
mkdir -p "$STORE"
step probe bash -c "'$TQKV' gpu probe --dir '$STORE' > '$OUT/probe.json'"
# gtest XML per binary (label gpu and gpu_ladder).
step test_gpu "$BUILD/tqkv_gpu_tests" --gtest_output="xml:$OUT/test_gpu.xml"
step test_gpu_ladder "$BUILD/tqkv_gpu_ladder_tests" --gtest_output="xml:$OUT/test_gpu_ladder.xml"
# tqkv-bench restore's rows; with a device, its CLI test runs small GPU rows and checks their JSON.
step test_bench "$BUILD/tqkv_bench_tests" --gtest_output="xml:$OUT/test_bench.xml"
# Codec benchmark: 4 heads x 128 dims x 1M tokens = 4M vectors, 1 GiB of f16 output per decode.
step bench_tq3 bash -c "'$TQKV_BENCH' gpu --codec tq3 --heads 4 --head-dim 128 --tokens 1048576 > '$OUT/bench_tq3.json'"
step bench_tq4 bash -c "'$TQKV_BENCH' gpu --codec tq4 --heads 8 --head-dim 128 --tokens 524288 > '$OUT/bench_tq4.json'"
# The seed figure's GPU rows: fp16 + standard (buffered) I/O into the GPU vs tq3 through the GDS
# ladder (io_used says which rung ran) and through O_DIRECT + pinned copies, with the host tq3 row
# for reference. Each worker checkpoints its own session first; page cache dropped per restore.
mkdir -p "$STORE-bench"
step bench_restore_gpu timeout 300 "$TQKV_BENCH" restore --model qwen2.5-7b --tokens 50000 \
  --workers 2 --config fp16:buffered:gpu --config tq3:gds:gpu --config tq3:direct:gpu \
  --config tq3:direct --store "$STORE-bench" --json "$OUT/bench_restore_gpu.json" \
  --csv "$OUT/bench_restore_gpu.csv" --chart "$OUT/bench_restore_gpu.svg"
rm -rf "$STORE-bench"
# 50,000-token qwen2.5-7b sessions: tq3 (GPU decode) and fp16 (the seed's baseline row).
step ckpt_tq3 "$TQKV" checkpoint --model qwen2.5-7b --tokens 50000 --codec tq3 --store "$STORE" \
  --session q50k-tq3 --json "$OUT/checkpoint_tq3.json"
step ckpt_fp16 "$TQKV" checkpoint --model qwen2.5-7b --tokens 50000 --codec fp16 --store "$STORE" \
  --session q50k-fp16 --json "$OUT/checkpoint_fp16.json"
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null && echo dropped || echo "page cache NOT dropped"; }
for io in gds direct buffered ladder; do
  arg=(--io "$io"); [ "$io" = ladder ] && arg=()
  for rep in 1 2; do
    step "drop_${io}_$rep" drop
    step "restore_tq3_${io}_$rep" bash -c "'$TQKV' restore --store '$STORE' --session q50k-tq3 --target gpu ${arg[*]} --json > '$OUT/restore_tq3_${io}_$rep.json'"
  done
done
for io in buffered direct; do
  step "drop_fp16_$io" drop
  step "restore_fp16_$io" bash -c "'$TQKV' restore --store '$STORE' --session q50k-fp16 --target gpu --io $io --json > '$OUT/restore_fp16_$io.json'"
done
step restore_tq3_host bash -c "'$TQKV' restore --store '$STORE' --session q50k-tq3 --json > '$OUT/restore_tq3_host.json'"
rm -rf "$STORE"
echo "done: $OUT" | tee -a "$STEPS"

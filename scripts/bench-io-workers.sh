#!/usr/bin/env bash
# `tqkv-bench restore` with W workers, fp16 + direct, against fio with one job per session file
# (fio psync 1M and io_uring qd32 4M, page cache dropped before each), round by round; reader
# settings interleaved within a round. docs/lab/benchmarks-log.md 2.5.
#
#   bash scripts/bench-io-workers.sh [--workers 8] [--tokens 10000] [--rounds 2] [--store DIR] \
#        [SETTING ...]      SETTING: NAME|URI-OPTIONS|BENCH-ARGS (default: 'default||')
#   e.g. ... 'default||' 'two-lanes|qd=8|--read-lanes 2 --read-ahead 32MiB'
set -euo pipefail
cd "$(dirname "$0")/.."
workers=8 tokens=10000 rounds=2 store=out/bench-io-workers tqkv_bench=${TQKV_BENCH:-./build/tqkv-bench} settings=()
while (($#)); do
  case "$1" in
    --workers) workers=$2; shift ;;
    --tokens) tokens=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --store) store=$2; shift ;;
    --*) echo "bench-io-workers: unknown option $1" >&2; exit 2 ;;
    *) settings+=("$1") ;;
  esac
  shift
done
((${#settings[@]})) || settings=("default||")
command -v fio >/dev/null || { echo "bench-io-workers: fio is missing (bash scripts/install-deps.sh)" >&2; exit 1; }
[ -w /proc/sys/vm/drop_caches ] || { echo "bench-io-workers: needs root (drop_caches)" >&2; exit 1; }
out=$(mktemp); trap 'rm -f "$out"' EXIT
for ((r = 1; r <= rounds; ++r)); do
  for s in "${settings[@]}"; do
    IFS='|' read -r name opts extra <<<"$s"
    rm -rf "$store"; mkdir -p "$store"
    # shellcheck disable=SC2086  # BENCH-ARGS are words
    "$tqkv_bench" restore --workers "$workers" --tokens "$tokens" --config fp16:direct \
      --store "$store${opts:+?$opts}" --keep --no-quality --no-breakdown $extra --json "$out" >/dev/null
    python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results'][0]; print('round %s  %-28s tqkv-bench restore read %.3f GB/s' % (sys.argv[2], sys.argv[3], r['read_gbps_aggregate']))" \
      "$out" "$r" "$name"
  done
  mapfile -t files < <(find "$store" -name '*.tqkv' | sort)
  size=$(( $(stat -c %s "${files[0]}") / 4194304 * 4194304 ))
  jobs=(); for f in "${files[@]}"; do jobs+=(--name="j$(basename "$f")" --filename="$f"); done
  for cfg in "1M psync 1" "4M io_uring 32"; do
    read -r bs engine depth <<<"$cfg"
    sync; echo 3 >/proc/sys/vm/drop_caches
    fio --rw=read --bs="$bs" --ioengine="$engine" --iodepth="$depth" --direct=1 --size="$size" \
      --readonly --invalidate=1 --group_reporting --output-format=json "${jobs[@]}" |
      python3 -c "import json,sys; print('round %s  fio %-23s %.3f GB/s (%s jobs)' % (sys.argv[1], sys.argv[2], json.load(sys.stdin)['jobs'][0]['read']['bw_bytes'] / 1e9, sys.argv[3]))" \
        "$r" "$engine $bs qd$depth" "${#files[@]}"
  done
done

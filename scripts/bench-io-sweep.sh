#!/usr/bin/env bash
# Reader settings against fio on one session file, interleaved round by round (page cache
# dropped before every run), then per setting: median GB/s and the median and geometric mean of
# its per-round ratio to the first setting. Use it to compare reader settings on a disk whose
# speed swings between minutes (docs/lab/benchmarks-log.md 2.5); scripts/bench-io.sh makes the file.
#
#   bash scripts/bench-io-sweep.sh ROUNDS SETTING [SETTING ...]
#   SETTING: fio4 (fio io_uring qd32 4M) | fio1 (fio psync 1M) | IO|URI-OPTIONS|RESTORE-ARGS
#   e.g. bash scripts/bench-io-sweep.sh 6 fio4 'uring||' 'uring|qd=8|--read-lanes 2 --read-ahead 32MiB'
#
# Env: FILE_DIR (default out/bench-io, session bench-io-0), TQKV (default ./build/tqkv).
set -euo pipefail
cd "$(dirname "$0")/.."
(($# >= 2)) || { sed -n '2,10p' "$0"; exit 2; }
rounds=$1; shift
dir=$(cd "${FILE_DIR:-out/bench-io}" && pwd) tqkv=${TQKV:-./build/tqkv}
file=$dir/bench-io-0.tqkv
[ -s "$file" ] || { echo "bench-io-sweep: $file missing (run scripts/bench-io.sh first)" >&2; exit 1; }
[ -w /proc/sys/vm/drop_caches ] || { echo "bench-io-sweep: needs root (drop_caches)" >&2; exit 1; }
size=$(( $(stat -c %s "$file") / 4194304 * 4194304 ))
results=$(mktemp); trap 'rm -f "$results"' EXIT
fio_gbps() {  # ENGINE BS DEPTH
  fio --name=j --filename="$file" --rw=read --bs="$2" --ioengine="$1" --iodepth="$3" --direct=1 \
    --size="$size" --readonly --invalidate=1 --output-format=json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"]/1e9)'
}
for ((r = 1; r <= rounds; ++r)); do
  for s in "$@"; do
    sync; echo 3 >/proc/sys/vm/drop_caches
    case $s in
      fio4) v=$(fio_gbps io_uring 4M 32) ;;
      fio1) v=$(fio_gbps psync 1M 1) ;;
      *) IFS='|' read -r io opts extra <<<"$s"
         # shellcheck disable=SC2086  # RESTORE-ARGS are words
         v=$("$tqkv" restore --store "$dir${opts:+?$opts}" --session bench-io-0 --io "$io" --drop-cache --json $extra |
             python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["bytes_read"]/r["restore_s"]/1e9)') ;;
    esac
    printf '%s\t%s\t%s\n' "$r" "$s" "$v" >>"$results"
    printf 'round %d  %-50s %6.3f GB/s\n' "$r" "$s" "$v" >&2
  done
done
python3 - "$results" "$1" <<'PY'
import collections, math, statistics as st, sys
runs = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, s, v = line.rstrip("\n").split("\t")
    runs[r][s] = float(v)
ref = sys.argv[2]
print(f"\n{'setting':50} {'median':>7} {'min':>6} {'max':>6}  vs {ref}: median, geomean of per-round ratios")
for s in runs["1"]:
    v = [runs[r][s] for r in runs]
    q = [runs[r][s] / runs[r][ref] for r in runs]
    g = math.exp(sum(map(math.log, q)) / len(q))
    print(f"{s:50} {st.median(v):7.3f} {min(v):6.3f} {max(v):6.3f}  {st.median(q):.2f}x, {g:.2f}x")
PY

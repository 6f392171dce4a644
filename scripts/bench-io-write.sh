#!/usr/bin/env bash
# The disk's own write speed next to tqkv's checkpoint, durable both: fio psync/1M, psync/4M and
# io_uring/qd32/4M O_DIRECT writes and a buffered psync/1M one, each with a final fsync, then `tqkv checkpoint --codec fp16` into a
# store with io=direct, uring and buffered (each ends with fdatasync, docs/store.md), a fresh
# file every time, the tests interleaved round by round (round r starts at test r - 1), medians.
#
#   bash scripts/bench-io-write.sh [--tokens 10000] [--model qwen2.5-7b] [--rounds 3]
#                                  [--dir out/bench-io-write] [--json out/bench-io-write.json]
#
# tqkv's figure is bytes / the writer thread's time in the store's Append and Commit
# (`write_busy_s`): the generation of the synthetic session, slower than the disk here, runs
# beside it and is left out. O_DIRECT appends are synchronous pwrites, so that is the disk's time;
# buffered appends are copies into the page cache (write-back started at once) plus the final
# fdatasync's wait, which undercounts what the disk did while the session was generated.
# docs/lab/benchmarks-log.md 2.5c.
set -euo pipefail
cd "$(dirname "$0")/.."

tokens=10000 model=qwen2.5-7b rounds=3 dir=out/bench-io-write json=out/bench-io-write.json
tqkv=./build/tqkv
while (($#)); do
  case "$1" in
    --tokens) tokens=$2; shift ;;
    --model) model=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --dir) dir=$2; shift ;;
    --json) json=$2; shift ;;
    --tqkv) tqkv=$2; shift ;;
    *) echo "bench-io-write: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
command -v fio >/dev/null || { echo "bench-io-write: fio is missing (bash scripts/install-deps.sh)" >&2; exit 1; }
[ -x "$tqkv" ] || { echo "bench-io-write: $tqkv not built (bash scripts/build.sh)" >&2; exit 1; }
mkdir -p "$dir" "$(dirname "$json")"
dir=$(cd "$dir" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work" "$dir"/fio.dat "$dir"/s' EXIT

# The session's size, from one checkpoint (not timed).
"$tqkv" checkpoint --model "$model" --tokens "$tokens" --codec fp16 --store "$dir/s" --session probe \
  --json "$work/probe.json" >/dev/null
bytes=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["bytes_written"])' "$work/probe.json")
fio_size=$((bytes / 4194304 * 4194304))
echo "bench-io-write: $model fp16 $tokens tokens ($((bytes / 1000000)) MB), $rounds rounds" >&2

run_fio() {  # ENGINE BS [IODEPTH [DIRECT]]
  rm -f "$dir/fio.dat"
  local args=(--name=w --filename="$dir/fio.dat" --rw=write --bs="$2" --ioengine="$1"
              --direct="${4:-1}" --size="$fio_size" --end_fsync=1 --output-format=json)
  [ -n "${3:-}" ] && args+=(--iodepth="$3")
  fio "${args[@]}" >"$work/fio.json"
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["jobs"][0]["write"]["bw_bytes"])' "$work/fio.json"
}

run_tqkv() {  # IO
  rm -rf "$dir/s"
  "$tqkv" checkpoint --model "$model" --tokens "$tokens" --codec fp16 --store "file://$dir/s?io=$1" \
    --session w --json "$work/c.json" >/dev/null
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["bytes_written"] / j["write_busy_s"])' "$work/c.json"
}

tests=("fio psync 1M" "fio psync 4M" "fio io_uring qd32 4M" "fio buffered 1M" "tqkv checkpoint direct"
       "tqkv checkpoint uring" "tqkv checkpoint buffered")
n_tests=${#tests[@]}
: >"$work/results"
for ((r = 1; r <= rounds; ++r)); do
  for ((i = 0; i < n_tests; ++i)); do
    t=${tests[(i + r - 1) % n_tests]}
    sync
    case "$t" in
      "fio psync 1M") v=$(run_fio psync 1M) ;;
      "fio psync 4M") v=$(run_fio psync 4M) ;;
      "fio io_uring qd32 4M") v=$(run_fio io_uring 4M 32) ;;
      "fio buffered 1M") v=$(run_fio psync 1M 1 0) ;;  # through the page cache, then fsync
      "tqkv checkpoint direct") v=$(run_tqkv direct) ;;
      "tqkv checkpoint uring") v=$(run_tqkv uring) ;;
      "tqkv checkpoint buffered") v=$(run_tqkv buffered) ;;
    esac
    printf '%s\t%s\t%s\n' "$r" "$t" "$v" >>"$work/results"
    printf 'round %d  %-26s %6.3f GB/s\n' "$r" "$t" "$(python3 -c "print($v/1e9)")" >&2
  done
done

python3 - "$work/results" "$json" "$model" "$tokens" "$bytes" <<'PY'
import json, statistics, sys
path, out, model, tokens, size = sys.argv[1:]
rows = {}
for line in open(path):
    r, t, v = line.rstrip("\n").split("\t")
    rows.setdefault(t, []).append(float(v) / 1e9)
med = {t: statistics.median(v) for t, v in rows.items()}
# The yardstick: fio's best O_DIRECT write; "fio buffered 1M" is the page cache's own speed.
fio_best = max(m for t, m in med.items() if t.startswith("fio") and "buffered" not in t)
print(f"\n{'test':26} {'median GB/s':>11} {'min':>7} {'max':>7} {'vs fio best':>11}")
for t, v in rows.items():
    print(f"{t:26} {med[t]:11.3f} {min(v):7.3f} {max(v):7.3f} {med[t] / fio_best:10.2f}x")
print(f"\n{model} fp16 {tokens} tokens, {int(size) / 1e6:.1f} MB; {len(next(iter(rows.values())))} rounds; "
      "every write durable (fio --end_fsync=1, tqkv fdatasync at commit)")
json.dump({"model": model, "tokens": int(tokens), "file_bytes": int(size), "gbps": rows,
           "median_gbps": med, "fio_best_gbps": fio_best,
           "ratio_to_fio_best": {t: m / fio_best for t, m in med.items()}}, open(out, "w"), indent=2)
print(f"json: {out}")
PY

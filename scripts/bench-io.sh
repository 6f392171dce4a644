#!/usr/bin/env bash
# The disk's own speed next to tqkv's restore, on the same file: fio psync/1M, io_uring/qd32/4M and
# io_uring/qd16/1M O_DIRECT reads, then `tqkv restore --io direct` and `--io uring` (and buffered,
# and direct with `--read-lanes 1`: one batch in flight at a time, the reader before lanes), page
# cache dropped before every run, the tests interleaved round by round (each round starting one
# test later), medians over the rounds.
#
#   bash scripts/bench-io.sh [--tokens 10000] [--model qwen2.5-7b] [--codec fp16] [--rounds 3]
#                            [--workers 1] [--dir out/bench-io] [--load] [--json out/bench-io.json]
#
# --workers W: W sessions, fio with W jobs (one per file) against W `tqkv restore` processes
# started together (aggregate GB/s = all bytes / wall time of the group, start-up included).
# --load: two `stress-ng --cpu` workers keep both cores busy during every run (fio included).
# Needs root for drop_caches (else each restore drops its own file with --drop-cache and fio
# runs cold only if the file was not cached; the report says which). docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."

tokens=10000 model=qwen2.5-7b codec=fp16 rounds=3 workers=1 dir=out/bench-io load=0
json=out/bench-io.json tqkv=./build/tqkv
while (($#)); do
  case "$1" in
    --tokens) tokens=$2; shift ;;
    --model) model=$2; shift ;;
    --codec) codec=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --workers) workers=$2; shift ;;
    --dir) dir=$2; shift ;;
    --json) json=$2; shift ;;
    --tqkv) tqkv=$2; shift ;;
    --load) load=1 ;;
    *) echo "bench-io: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
command -v fio >/dev/null || { echo "bench-io: fio is missing (bash scripts/install-deps.sh)" >&2; exit 1; }
[ -x "$tqkv" ] || { echo "bench-io: $tqkv not built (bash scripts/build.sh)" >&2; exit 1; }
if ((load)) && ! command -v stress-ng >/dev/null; then
  echo "bench-io: --load needs stress-ng (bash scripts/install-deps.sh)" >&2; exit 1
fi
mkdir -p "$dir" "$(dirname "$json")"
dir=$(cd "$dir" && pwd)
work=$(mktemp -d)
stress_pid=""
cleanup() {
  [ -n "$stress_pid" ] && kill "$stress_pid" 2>/dev/null && wait "$stress_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

can_drop=0
if [ -w /proc/sys/vm/drop_caches ]; then can_drop=1; fi
drop() {
  if ((can_drop)); then sync; echo 3 >/proc/sys/vm/drop_caches; fi
}

files=()
for ((w = 0; w < workers; ++w)); do
  f="$dir/bench-io-$w.tqkv"
  if [ ! -s "$f" ]; then
    "$tqkv" checkpoint --model "$model" --tokens "$tokens" --codec "$codec" --seed $((1 + w)) \
      --store "$dir" --session "bench-io-$w" >/dev/null
  fi
  files+=("$f")
done
bytes=$(stat -c %s "${files[0]}")
# fio reads whole 4 MiB blocks of every file: the tail below one block is left out.
fio_size=$((bytes / 4194304 * 4194304))
echo "bench-io: $workers x $model $codec $tokens tokens ($((bytes / 1000000)) MB per file), $rounds rounds," \
  "page cache $( ((can_drop)) && echo dropped before every run || echo NOT dropped: not root)" \
  "$( ((load)) && echo ', 2 stress-ng --cpu workers running')" >&2

if ((load)); then
  stress-ng --cpu 2 --timeout 0 --quiet &
  stress_pid=$!
  sleep 1
fi

# fio: one job per file, started together; prints aggregate bytes/s.
run_fio() {  # ENGINE BS [IODEPTH]
  local args=(--rw=read --bs="$2" --ioengine="$1" --direct=1 --size="$fio_size" --readonly
              --invalidate=1 --group_reporting --output-format=json)
  [ -n "${3:-}" ] && args+=(--iodepth="$3")
  local jobs=()
  for f in "${files[@]}"; do jobs+=(--name="j$(basename "$f")" --filename="$f"); done
  fio "${args[@]}" "${jobs[@]}" >"$work/fio.json"
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["jobs"][0]["read"]["bw_bytes"])' "$work/fio.json"
}

# tqkv restore: W processes started together; aggregate bytes/s over the group's wall time.
run_tqkv() {  # IO [URI-OPTIONS [RESTORE-ARGS...]]
  local pids=() t0 t1
  t0=$(date +%s.%N)
  for ((w = 0; w < workers; ++w)); do
    "$tqkv" restore --store "$dir${2:+?$2}" --session "bench-io-$w" --io "$1" --drop-cache --json "${@:3}" \
      >"$work/r$w.json" 2>"$work/e$w" &
    pids+=($!)
  done
  for ((w = 0; w < workers; ++w)); do
    wait "${pids[w]}" || { echo "bench-io: tqkv restore $* (worker $w) failed: $(cat "$work/e$w")" >&2; exit 1; }
  done
  t1=$(date +%s.%N)
  python3 - "$work" "$workers" "$t0" "$t1" <<'EOF'
import json, sys
work, n, t0, t1 = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
rs = [json.load(open(f"{work}/r{w}.json")) for w in range(n)]
cached = sum(r.get("bytes_page_cache", 0) for r in rs if r["io"] != "buffered")
if cached:
    print(f"bench-io: {cached / 1e6:.1f} MB of an O_DIRECT restore came through the page cache",
          file=sys.stderr)
if n == 1:
    print(rs[0]["bytes_read"] / rs[0]["restore_s"])  # the restore's own timing
else:
    print(sum(r["bytes_read"] for r in rs) / (t1 - t0))
EOF
}

tests=("fio psync 1M" "fio io_uring qd32 4M" "fio io_uring qd16 1M" "tqkv restore direct"
       "tqkv restore uring" "tqkv restore buffered" "tqkv direct 1 lane")
: >"$work/results"
# Round r starts at test r-1 and wraps around: no test always runs right after the same one.
n_tests=${#tests[@]}
for ((r = 1; r <= rounds; ++r)); do
  for ((i = 0; i < n_tests; ++i)); do
    t=${tests[(i + r - 1) % n_tests]}
    drop
    case "$t" in
      "fio psync 1M") v=$(run_fio psync 1M) ;;
      "fio io_uring qd32 4M") v=$(run_fio io_uring 4M 32) ;;
      "fio io_uring qd16 1M") v=$(run_fio io_uring 1M 16) ;;  # the depth the restore keeps
      "tqkv restore direct") v=$(run_tqkv direct) ;;
      "tqkv restore uring") v=$(run_tqkv uring) ;;
      "tqkv restore buffered") v=$(run_tqkv buffered) ;;
      "tqkv direct 1 lane") v=$(run_tqkv direct "" --read-lanes 1) ;;  # one batch at a time (before)
    esac
    printf '%s\t%s\t%s\n' "$r" "$t" "$v" >>"$work/results"
    printf 'round %d  %-22s %6.3f GB/s\n' "$r" "$t" "$(python3 -c "print($v/1e9)")" >&2
  done
done

python3 - "$work/results" "$json" "$workers" "$model" "$codec" "$tokens" "$bytes" "$load" "$can_drop" <<'EOF'
import json, statistics, sys
path, out, workers, model, codec, tokens, size, load, dropped = sys.argv[1:]
rows = {}
for line in open(path):
    r, t, v = line.rstrip("\n").split("\t")
    rows.setdefault(t, []).append(float(v) / 1e9)
med = {t: statistics.median(v) for t, v in rows.items()}
# The floor's yardstick (docs/lab/benchmarks-log.md 2.5): fio's best of psync/1M and io_uring/qd32/4M;
# the last column holds the restore to every fio setting run here.
fio_best = max(med["fio psync 1M"], med["fio io_uring qd32 4M"])
fio_all = max(m for t, m in med.items() if t.startswith("fio"))
print(f"\n{'test':24} {'median GB/s':>11} {'min':>7} {'max':>7} {'vs fio best':>11} {'vs any fio':>10}")
for t, v in rows.items():
    print(f"{t:24} {med[t]:11.3f} {min(v):7.3f} {max(v):7.3f} {med[t] / fio_best:10.2f}x"
          f" {med[t] / fio_all:9.2f}x")
print(f"\n{workers} x {model} {codec} {tokens} tokens, {int(size) / 1e6:.1f} MB per file; "
      f"{len(next(iter(rows.values())))} rounds; page cache {'dropped' if dropped == '1' else 'NOT dropped'}; "
      f"{'2 stress-ng --cpu workers running' if load == '1' else 'no added load'}")
json.dump({"workers": int(workers), "model": model, "codec": codec, "tokens": int(tokens),
           "file_bytes": int(size), "load": load == "1", "page_cache_dropped": dropped == "1",
           "gbps": rows, "median_gbps": med, "fio_best_gbps": fio_best, "fio_any_best_gbps": fio_all,
           "ratio_to_fio_best": {t: m / fio_best for t, m in med.items()}},
          open(out, "w"), indent=2)
print(f"json: {out}")
EOF

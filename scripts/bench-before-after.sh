#!/usr/bin/env bash
# Usage: scripts/bench-before-after.sh OLD_TQKV NEW_TQKV [ROUNDS]
# Two tqkv binaries restore the same stored qwen2.5-7b sessions (10K tokens, tq3 and fp16),
# alternating, ROUNDS rounds (7); warm page cache (buffered), so the figure is the pipeline's own
# cost. Prints one line per restore: binary, session, the restore's --json (restore_s excludes
# the allocation in both), then the medians and the new/old ratio.
set -eu
B=$1; A=$2; N=${3:-7}; S=$(mktemp -d)
trap 'rm -rf "$S"' EXIT
$B checkpoint --model qwen2.5-7b --tokens 10000 --codec tq3 --store $S --session s >/dev/null
$B checkpoint --model qwen2.5-7b --tokens 10000 --codec fp16 --store $S --session f >/dev/null
for rep in $(seq "$N"); do
  for which in before after; do
    bin=$B; [ $which = after ] && bin=$A
    for sess in s f; do
      echo "$which $sess $($bin restore --store $S --session $sess --io buffered --threads 2 --json | tr -d '\n ')"
    done
  done
done | tee "$S/out"
python3 - "$S/out" <<'PY'
import json, statistics, sys
t = {}
for line in open(sys.argv[1]):
    which, sess, j = line.split(" ", 2)
    t.setdefault((which, sess), []).append(json.loads(j)["restore_s"])
for sess, name in (("s", "tq3"), ("f", "fp16")):
    b, a = statistics.median(t[("before", sess)]), statistics.median(t[("after", sess)])
    print(f"{name}: restore_s median old {b:.3f} new {a:.3f} new/old {a / b:.2f}")
PY

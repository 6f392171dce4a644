#!/usr/bin/env bash
# Usage: scripts/bench-io-before-after.sh OLD_TQKV NEW_TQKV [ROUNDS] [DIR] [SESSION]
# Two tqkv binaries restore the same stored session (default: the fp16 file scripts/bench-io.sh
# leaves in out/bench-io) with --io direct and --io uring, alternating, page cache dropped before
# every restore (root); prints the medians and the paired new/old ratios (docs/lab/benchmarks-log.md §2.5).
set -euo pipefail
OLD=$1; NEW=$2; N=${3:-8}; DIR=$(realpath "${4:-out/bench-io}"); SESS=${5:-bench-io-0}
for r in $(seq "$N"); do for io in direct uring; do for b in old new; do
  bin=$OLD; [ "$b" = new ] && bin=$NEW
  sync; echo 3 > /proc/sys/vm/drop_caches
  echo "$io $b $("$bin" restore --store "file://$DIR?io=$io" --session "$SESS" --json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["gbps"])')"
done; done; echo "round $r/$N" >&2; done | python3 -c '
import math, statistics, sys
by = {}
for io, b, v in (l.split() for l in sys.stdin):
    by.setdefault((io, b), []).append(float(v))
for io in ("direct", "uring"):
    o, n = by[(io, "old")], by[(io, "new")]
    r = [b / a for a, b in zip(o, n)]
    print(f"{io}: old median {statistics.median(o):.3f} new median {statistics.median(n):.3f} GB/s;"
          f" paired new/old median {statistics.median(r):.2f}"
          f" geomean {math.exp(sum(map(math.log, r)) / len(r)):.2f}")
'

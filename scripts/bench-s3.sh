#!/usr/bin/env bash
# s3:// restore speed against a loopback SeaweedFS (scripts/start-test-servers.sh), printed as JSON:
#  1. one qwen2.5-7b tq3 session (--tokens, default 10000) restored with `tqkv restore` (read,
#     checksum, decode to FP16) vs the same object fetched by `curl` with the same number of
#     parallel ranged GETs (--gets, default 8 = URI lanes=8: the s3:// reader's GETs in flight),
#     and vs the same object restored from a local directory (page cache warm: the restore
#     without a network, its decode-bound floor on this machine), rounds interleaved;
#  2. the store alone: `tqkv-bench restore --workers 1` stages (raw read, read+checksum);
#  3. `tqkv-bench restore --workers 8` on s3:// next to file:// (unless --no-workers).
# Each round also counts CPU seconds (SeaweedFS's process and the client's) of the curl fetch and
# of the s3:// restore: with the server on the same cores, (server + client CPU) / cores bounds
# how fast either can be here ("cpu_bound_s"). The restore's client CPU there is the restore's own
# (`restore --json` cpu_s less alloc_s); "client_s" is the whole process, start-up and warming of
# its memory included.
#   bash scripts/bench-s3.sh [--tokens 10000] [--rounds 3] [--gets 8] [--no-workers] > out.json
set -euo pipefail
cd "$(dirname "$0")/.."
tokens=10000 rounds=3 gets=8 workers=1 tqkv=${TQKV:-./build/tqkv}
tqkv_bench=${TQKV_BENCH:-$(dirname "$tqkv")/tqkv-bench}
while (($#)); do
  case "$1" in
    --tokens) tokens=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --gets) gets=$2; shift ;;
    --no-workers) workers=0 ;;
    *) echo "bench-s3: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
((gets >= 1)) || { echo "bench-s3: --gets must be at least 1" >&2; exit 2; }
export TQKV_TEST_SERVERS_DIR=${TQKV_TEST_SERVERS_DIR:-/tmp/tqkv-bench-s3-$(id -u)}
eval "$(bash scripts/start-test-servers.sh)"
[ -n "${TQKV_TEST_S3_URI:-}" ] || { echo "bench-s3: no S3 server: ${TQKV_TEST_S3_SKIP:-}" >&2; exit 1; }
export AWS_ACCESS_KEY_ID=$TQKV_TEST_S3_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY=$TQKV_TEST_S3_SECRET_ACCESS_KEY
endpoint=${TQKV_TEST_S3_URI#*endpoint=}; endpoint=${endpoint%%&*}
run=bench$$
uri="s3://tqkv-test/$run?endpoint=$endpoint&region=us-east-1&lanes=$gets"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
"$tqkv" checkpoint --store "$uri" --session s --tokens "$tokens" --codec tq3 >&2
url="$endpoint/tqkv-test/$run/s.tqkv"
sig=(--aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY"
     -H "x-amz-content-sha256: UNSIGNED-PAYLOAD")
size=$(curl -sfI "${sig[@]}" "$url" | tr -d '\r' | awk 'tolower($1)=="content-length:"{print $2}')
# The same object in a local directory store: restored from the page cache, no network.
mkdir -p "$work/local"
curl -sf "${sig[@]}" -o "$work/local/s.tqkv" "$url"
weed_pid=$(cat "$TQKV_TEST_SERVERS_DIR/weed.pid")
hz=$(getconf CLK_TCK)
# CPU seconds so far: SeaweedFS's (utime + stime) and this shell's reaped children's.
server_cpu() { awk -v hz="$hz" '{print ($14 + $15) / hz}' "/proc/$weed_pid/stat"; }
client_cpu() { awk -v hz="$hz" '{print ($16 + $17) / hz}' "/proc/$$/stat"; }
curl_once() {  # wall seconds of $gets parallel ranged GETs covering the object
  local t0 t1 i a b
  t0=$(date +%s.%N)
  for ((i = 0; i < gets; ++i)); do
    a=$((size * i / gets)); b=$((size * (i + 1) / gets - 1))
    curl -sf "${sig[@]}" -r "$a-$b" -o /dev/null "$url" &
  done
  wait
  t1=$(date +%s.%N)
  python3 -c "print($t1 - $t0)"
}
: >"$work/rounds"
for ((r = 1; r <= rounds; ++r)); do
  s0=$(server_cpu) c0=$(client_cpu)
  c=$(curl_once)
  s1=$(server_cpu) c1=$(client_cpu)
  "$tqkv" restore --store "$uri" --session s --read-lanes 4 --json >"$work/restore.json"
  s2=$(server_cpu) c2=$(client_cpu)
  cpu=$(python3 -c "print($s1 - $s0, $c1 - $c0, $s2 - $s1, $c2 - $c1)")
  "$tqkv" restore --store "$work/local" --session s --read-lanes 4 --json >"$work/local.json"
  python3 - "$work/restore.json" "$c" "$work/local.json" $cpu >>"$work/rounds" <<'EOF'
import json, os, sys
d = json.load(open(sys.argv[1]))
loc = json.load(open(sys.argv[3]))
cs, cc, rs, rc = map(float, sys.argv[4:8])
n = os.cpu_count()
# The restore alone: its process CPU less the destination's allocation and first touch
# (single-threaded, alloc_s).
ri = d["cpu_s"] - d["alloc_s"]
print(json.dumps({"curl_s": float(sys.argv[2]), "restore_s": d["restore_s"],
                  "read_busy_s": d["read_busy_s"], "decode_busy_s": d["decode_busy_s"],
                  "first_layer_s": d["first_layer_s"], "bytes": d["bytes_read"],
                  "local_restore_s": loc["restore_s"],
                  "curl_cpu": {"server_s": cs, "client_s": cc, "cpu_bound_s": (cs + cc) / n},
                  "restore_cpu": {"server_s": rs, "client_s": rc, "in_restore_s": ri,
                                  "cpu_bound_s": (rs + ri) / n}}))
EOF
done
# The store alone (the restore's own reader, no decode): tqkv-bench restore's stages, one worker.
"$tqkv_bench" restore --workers 1 --tokens "$tokens" --config tq3:buffered --read-lanes 4 \
  --store "s3://tqkv-test/${run}w1?endpoint=$endpoint&region=us-east-1&lanes=$gets" \
  --no-quality --breakdown --json "$work/w1.json" >&2
if ((workers)); then
  "$tqkv_bench" restore --workers 8 --tokens "$tokens" --config tq3:buffered --no-quality \
    --store "s3://tqkv-test/${run}w8?endpoint=$endpoint&region=us-east-1" --json "$work/s3w8.json" >&2
  "$tqkv_bench" restore --workers 8 --tokens "$tokens" --config tq3:buffered --no-quality \
    --store "$work/file-store" --json "$work/filew8.json" >&2
fi
python3 - "$work" "$gets" "$tokens" "$uri" <<'EOF'
import json, os, platform, statistics, sys
work, gets, tokens, uri = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rounds = [json.loads(l) for l in open(os.path.join(work, "rounds"))]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
med = lambda k: statistics.median(r[k] for r in rounds)
out = {
    "cpu": cpu, "vcpus": os.cpu_count(), "tokens": tokens, "codec": "tq3", "store": uri,
    "parallel_gets": gets, "object_bytes": os.path.getsize(os.path.join(work, "local", "s.tqkv")), "rounds": rounds,
    "curl_s_median": med("curl_s"), "restore_s_median": med("restore_s"),
    "restore_vs_curl": med("curl_s") / med("restore_s"),
    # The same restore from a local directory (page cache): what the restore takes without a
    # network on this machine, and so the most restore_vs_curl can be here.
    "local_restore_s_median": med("local_restore_s"),
    "local_restore_vs_curl": med("curl_s") / med("local_restore_s"),
    "restore_vs_local_restore": med("local_restore_s") / med("restore_s"),
    # CPU seconds (server + client) of each; with the server on these cores, the restore can
    # be no faster than its CPU seconds / cores, so curl_s / that bounds restore_vs_curl here.
    "curl_cpu_s_median": statistics.median(r["curl_cpu"]["server_s"] + r["curl_cpu"]["client_s"] for r in rounds),
    "restore_cpu_s_median": statistics.median(r["restore_cpu"]["server_s"] + r["restore_cpu"]["in_restore_s"] for r in rounds),
    "restore_vs_curl_cpu_bound": med("curl_s") / statistics.median(r["restore_cpu"]["cpu_bound_s"] for r in rounds),
    "load_average": open("/proc/loadavg").read().split()[:3],
}
def rows(name):
    p = os.path.join(work, name)
    if not os.path.exists(p):
        return None
    return json.load(open(p))
keys = ("restore_s_mean", "restore_s_p50", "restore_s_p99", "write_s_mean", "read_gbps_aggregate",
        "fp16_gbps_aggregate", "raw_read_s", "raw_read_gbps", "read_only_s", "decode_only_s",
        "bottleneck", "workers", "file_bytes")
w1 = rows("w1.json")
if w1:
    r = w1["results"][0]
    out["store_only_w1"] = {k: r.get(k) for k in keys}
    # The same bytes through the restore's reader, no decode, against curl.
    out["raw_read_vs_curl"] = out["curl_s_median"] / r["raw_read_s"]
    out["read_checksum_vs_curl"] = out["curl_s_median"] / r["read_only_s"]
for k in ("s3w8", "filew8"):
    r = rows(k + ".json")
    if r:
        out["bench_restore_" + k] = {"store": r["store"], **{x: r["results"][0].get(x) for x in keys}}
print(json.dumps(out, indent=1))
EOF

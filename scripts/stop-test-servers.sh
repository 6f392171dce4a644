#!/usr/bin/env bash
# Stops what scripts/start-test-servers.sh started (redis, the redis cluster nodes, ganesha,
# SeaweedFS; rpcbind is left running, other users may need it) and removes the state directory
# with the NFS export and the SeaweedFS data.
set -uo pipefail
state=${TQKV_TEST_SERVERS_DIR:-/tmp/tqkv-test-servers-$(id -u)}
[ -d "$state" ] || exit 0
exec 9>"$state/lock"
flock -w 120 9
stop_pidfile() {
  local f=$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.05
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  fi
  rm -f "$f"
}
stop_pidfile "$state/redis.pid"
for f in "$state"/cluster-*.pid; do stop_pidfile "$f"; done
stop_pidfile "$state/ganesha.pid"
stop_pidfile "$state/weed.pid"
rm -rf "$state"

# Lanes and stages for scripts/test.sh (sourced). A lane is a background shell running one
# function, its output in $LANES_DIR/<lane>.log; a stage is a named, timed part of a lane. Lanes
# hand results to each other through marks ($LANES_DIR/<name>.mark holds a status). Every stage's
# start, wall seconds and CPU seconds (its commands', user + system) go to stages.tsv, printed as
# one table at the end, so that each change to the suite's cost is a measured one.

LANES_DIR=${LANES_DIR:-build/test-logs}
LANE_PIDS=() LANE_NAMES=()
_lanes_t0=$SECONDS
_clk_tck=$(getconf CLK_TCK)

lanes_init() {
  rm -rf "$LANES_DIR"
  mkdir -p "$LANES_DIR"
  : >"$LANES_DIR/stages.tsv"
  exec 3>&1  # the console, for the progress lines of lanes whose output goes to a log
}

# The CPU ticks of this shell's finished children (no subshell: its own counters would be zero).
_lane_ticks() {
  local s
  read -r s </proc/$BASHPID/stat
  s=${s##*) }
  local -a f=($s)
  _ticks=$((f[13] + f[14]))  # cutime, cstime (fields 16 and 17)
}

# stage LANE NAME: ends this shell's current stage and starts NAME ("" ends the last one).
stage() {
  _lane_ticks
  if [ -n "${_stage_name:-}" ]; then
    local wall=$((SECONDS - _stage_t0)) cpu=$(((_ticks - _stage_ticks) / _clk_tck))
    printf '%s\t%s\t%d\t%d\t%d\n' "$_stage_lane" "$_stage_name" "$((_stage_t0 - _lanes_t0))" \
      "$wall" "$cpu" >>"$LANES_DIR/stages.tsv"
    _lane_say "stage: $_stage_lane/$_stage_name $wall s (CPU $cpu s)"
  fi
  _stage_lane=$1 _stage_name=$2 _stage_t0=$SECONDS _stage_ticks=$_ticks
  if [ -n "$2" ]; then
    _lane_say "$(printf '[%4d s] %s: %s' "$((SECONDS - _lanes_t0))" "$1" "$2")"
  fi
}

# A progress line on the console, and in the lane's log when in a lane.
_lane_say() {
  echo "$1" >&3
  if [ -n "${_in_lane:-}" ]; then echo "$1"; fi
}

# lane NAME FUNCTION [ARGS]: runs FUNCTION in the background; its status goes to NAME.rc.
lane() {
  local name=$1
  shift
  {
    set +e  # the lane's status is recorded, not fatal here
    (
      set -e
      _in_lane=1
      trap 'stage "" ""' EXIT  # the last stage is timed even when it fails
      "$@"
    ) >"$LANES_DIR/$name.log" 2>&1
    echo $? >"$LANES_DIR/$name.rc"
  } &
  LANE_PIDS+=($!) LANE_NAMES+=("$name")
}

mark() { echo "$2" >"$LANES_DIR/$1.mark"; }  # mark NAME STATUS

# await NAME LANE: waits for NAME's mark, which LANE sets; returns its status (99 if LANE ended
# without setting it).
await() {
  local f="$LANES_DIR/$1.mark"
  while [ ! -f "$f" ]; do
    if [ -f "$LANES_DIR/$2.rc" ] && [ ! -f "$f" ]; then
      echo "lanes: $2 ended without $1" >&2
      return 99
    fi
    sleep 1
  done
  return "$(cat "$f")"
}

# lanes_wait: waits for every lane, prints each one's log, and the stage table; returns 1 if a
# lane failed.
lanes_wait() {
  local i rc failed=()
  for i in "${!LANE_PIDS[@]}"; do
    wait "${LANE_PIDS[$i]}" || true
  done
  for i in "${!LANE_NAMES[@]}"; do
    rc=$(cat "$LANES_DIR/${LANE_NAMES[$i]}.rc" 2>/dev/null || echo 99)
    echo "==== lane ${LANE_NAMES[$i]} (exit status $rc; $LANES_DIR/${LANE_NAMES[$i]}.log)"
    cat "$LANES_DIR/${LANE_NAMES[$i]}.log"
    [ "$rc" = 0 ] || failed+=("${LANE_NAMES[$i]}")
  done
  if ((${#failed[@]})); then
    echo "==== failed lanes: ${failed[*]}"
    return 1
  fi
}

# lanes_summary: the stage table (start, wall and CPU seconds), sorted by start.
lanes_summary() {
  local total=$((SECONDS - _lanes_t0))
  echo "== stages (s): start, wall, CPU"
  sort -t$'\t' -k3,3n "$LANES_DIR/stages.tsv" |
    awk -F'\t' '{printf "  %-8s %-20s %5d %5d %5d\n", $1, $2, $3, $4, $5; cpu += $5}
                END {printf "stages total: '"$total"' s wall, %d s CPU\n", cpu}'
}

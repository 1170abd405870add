#!/usr/bin/env bash
# Installs what shardwise's build, tests and examples need from Debian 12's archive; skips apt when all is there.
set -euo pipefail
packages=(g++ cmake make ninja-build libeigen3-dev libboost-mpi-dev libopenmpi-dev openmpi-bin doctest-dev libxtensor-dev xtl-dev
          libopenblas-dev libdnnl-dev clang-format-19 python3-venv nlohmann-json3-dev libcli11-dev clang-14 libclang-rt-14-dev
          clang-19 libclang-rt-19-dev llvm-14 doxygen ccache
          iproute2 procps)  # the last two: the two-host test (scripts/two_hosts.sh)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

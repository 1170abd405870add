#!/usr/bin/env bash
# Builds the safetensors header fuzzer with clang (libFuzzer + AddressSanitizer + UndefinedBehaviorSanitizer) in
# its own build folder and runs it from the seed corpus tests/fuzz/corpus (bad cases and good files).
#   scripts/fuzz.sh [SECONDS=60] [BUILD_DIR=build-fuzz]
# New inputs go to BUILD_DIR/corpus; a finding is written to BUILD_DIR/crash-* and the script fails.
set -euo pipefail
seconds=${1:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${2:-$root/build-fuzz}
cxx=${SHARDWISE_FUZZ_CXX:-$(command -v clang++-14 || command -v clang++ || true)}
if [[ -z "$cxx" ]]; then
  echo "fuzz.sh: no clang++ found; run scripts/install-deps.sh (clang-14, libclang-rt-14-dev)" >&2
  exit 1
fi
cmake -S "$root/tests/fuzz" -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j2
mkdir -p "$build/corpus"
cd "$build"
./safetensors_header_fuzz -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
  -dict="$root/tests/fuzz/safetensors.dict" -print_final_stats=1 corpus "$root/tests/fuzz/corpus"

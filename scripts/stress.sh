#!/usr/bin/env bash
# The flake hunt: runs the thread-mesh and MPI tests ROUNDS times while a competing load keeps every core busy, and
# prints each test's failures and hangs (CTest's per-test timeout turns a hang into a named failure, well inside
# CI's limit). A test that fails only when the machine is busy shows up here, not in CI.
#   scripts/stress.sh [ROUNDS] [BUILD_DIR]
# ROUNDS: 10 unless given. BUILD_DIR: a build with the test suite (build-stress unless given; configured and built
# here if absent, g++ release as a user builds). The load: SHARDWISE_STRESS_LOAD busy loops (one per core unless
# given; a second copy of the tests would share their files in the build folder and fail for that alone) at nice
# SHARDWISE_STRESS_NICE (19 unless given). Not at nice 0: MPI's waiting ranks poll and yield, and beside loops of
# equal priority the scheduler gives the loops nearly every cycle, so that a plain MPI_Allreduce of 4 ranks takes
# 2 ms instead of 4 us and a 5 s test takes minutes (bench/run_mpi_beside_load.sh measures it; docs/test-suite.md).
# At nice 19 the loops still take every cycle the tests leave and hold a core for a time slice when they get it.
# The tests run at two slots over the cores, as CI's ASan + UBSan stage runs them.
# SHARDWISE_STRESS_TESTS: a CTest regular expression to hunt in fewer tests (all of the two labels unless given).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-10}
dir=${2:-build-stress}
load=${SHARDWISE_STRESS_LOAD:-$(nproc)}
niceness=${SHARDWISE_STRESS_NICE:-19}
[[ $rounds =~ ^[1-9][0-9]{0,3}$ ]] || { echo "stress.sh: ROUNDS must be a count from 1 to 9999, not '$rounds'" >&2; exit 2; }
[[ $load =~ ^[0-9]{1,2}$ ]] || { echo "stress.sh: SHARDWISE_STRESS_LOAD must be a count of busy loops, 0 to 99" >&2; exit 2; }
[[ $niceness =~ ^(1?[0-9])$ ]] || { echo "stress.sh: SHARDWISE_STRESS_NICE must be a niceness from 0 to 19" >&2; exit 2; }
jobs=$(nproc)
labels="threads|mpi"
only=()
[[ -n ${SHARDWISE_STRESS_TESTS:-} ]] && only=(-R "$SHARDWISE_STRESS_TESTS")

if [[ ! -f $dir/CTestTestfile.cmake ]]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  CXX=g++ cmake -S . -B "$dir" -GNinja "${launcher[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
    -DSHARDWISE_BUILD_EXAMPLES=OFF -DSHARDWISE_BUILD_BENCH=OFF -DSHARDWISE_BUILD_TOOLS=OFF \
    -DSHARDWISE_BUILD_COMPILE_CHECKS=OFF >/dev/null
fi
cmake --build "$dir" -j"$jobs" >/dev/null

loaders=()
start_load() {
  for ((i = 0; i < load; ++i)); do
    nice -n "$niceness" bash -c 'while :; do :; done' &
    loaders+=($!)
  done
}
stop_load() {
  local p
  for p in "${loaders[@]}"; do
    kill "$p" 2>/dev/null || true
  done
  loaders=()
}
trap stop_load EXIT

log=$(mktemp -d)
declare -A failed=() hung=()
for ((round = 1; round <= rounds; ++round)); do
  start_load
  started=$(date +%s)
  ctest --test-dir "$dir" -j$((jobs + 2)) -L "$labels" "${only[@]}" --output-on-failure >"$log/round$round.txt" 2>&1 || true
  stop_load
  summary=$(grep -E "tests passed|tests failed" "$log/round$round.txt" | tail -n 1)
  echo "round $round of $rounds ($((($(date +%s) - started))) s, $load busy loops at nice $niceness): $summary"
  while read -r name kind; do
    failed[$name]=$((${failed[$name]:-0} + 1))
    [[ $kind == *Timeout* ]] && hung[$name]=$((${hung[$name]:-0} + 1))
    echo "  failed: $name $kind"
  done < <(sed -nE 's/^[[:space:]]*[0-9]+ - ([^ ]+) \((.*)\)$/\1 \2/p' "$log/round$round.txt")
done

echo "== $rounds rounds of the tests labelled $labels ${only[*]} beside $load busy loops at nice $niceness; the rounds' output: $log"
if ((${#failed[@]} == 0)); then
  echo "stress: every test passed every round: 0 failures, 0 hangs"
  exit 0
fi
for name in "${!failed[@]}"; do
  echo "stress: $name failed ${failed[$name]} of $rounds rounds (${hung[$name]:-0} of them timed out)"
done
exit 1

#!/usr/bin/env bash
# Where a build folder's minutes went: its compile steps (Ninja's .ninja_log) and its tests (CTest's
# CTestCostData.txt), the slowest of each first. scripts/test.sh prints it after every stage's tests, so a CI log
# shows which target or test grew; docs/build-time.md ("The test suite's time") is made from these tables.
#   scripts/ci-times.sh BUILD_DIR [HOW_MANY]
set -euo pipefail
dir=${1:?usage: scripts/ci-times.sh BUILD_DIR [HOW_MANY]}
top=${2:-10}
log=$dir/.ninja_log
costs=$dir/Testing/Temporary/CTestCostData.txt

if [[ -f $log ]]; then
  # One line per output, its last build only (a log may hold earlier builds); times are milliseconds.
  awk 'NR > 1 { took[$4] = ($2 - $1) / 1000 } END { for (o in took) printf "%.1f %s\n", took[o], o }' "$log" |
    sort -rn >"$dir/.compile_seconds"
  awk -v top="$top" '{ sum += $1; n += 1 } END {
      printf "compile steps in %s: %d, %.0f s of compiler time (%.1f min on 2 cores)\n", ARGV[1], n, sum, sum / 120 }' \
    "$dir/.compile_seconds"
  echo "slowest $top compile steps (s):"
  head -n "$top" "$dir/.compile_seconds" | sed 's/^/  /'
else
  echo "no $log (built without Ninja): no compile times"
fi

if [[ -f $costs ]]; then
  # "name runs seconds" lines, then "---" and the failed tests; a fresh folder's one run gives each test's time.
  awk '/^---/ { exit } NF == 3 { sum += $3; n += 1; print $3, $1 } END {
      printf "%.0f s of test time in %d tests\n", sum, n > "/dev/stderr" }' "$costs" 2>&1 >/dev/null
  echo "slowest $top tests (s):"
  awk '/^---/ { exit } NF == 3 { printf "%.1f %s\n", $3, $1 }' "$costs" | sort -rn | head -n "$top" | sed 's/^/  /'
else
  echo "no $costs: no test times"
fi

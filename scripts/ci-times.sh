#!/usr/bin/env bash
# Where a build folder's minutes went: its compile steps (Ninja's .ninja_log) and its tests (CTest's
# CTestCostData.txt), the slowest of each first. scripts/test.sh prints it after every stage's tests, so a CI log
# shows which target or test grew; docs/test-suite.md is made from these tables.
#   scripts/ci-times.sh BUILD_DIR [HOW_MANY]
set -euo pipefail
dir=${1:?usage: scripts/ci-times.sh BUILD_DIR [HOW_MANY]}
top=${2:-10}
log=$dir/.ninja_log
costs=$dir/Testing/Temporary/CTestCostData.txt

# "seconds name" lines, slowest first, after a line with their sum: "what" names the kind of line.
slowest() {
  sort -rn | awk -v top="$top" -v what="$1" -v where="$dir" '
    { sum += $1; lines[NR] = sprintf("  %.1f %s", $1, $2) }
    END {
      printf "%s in %s: %d, %.0f s in all; the slowest %d (s):\n", what, where, NR, sum, top
      for (i = 1; i <= NR && i <= top; ++i) print lines[i]
    }'
}

if [[ -f $log ]]; then  # one line per output, its last build only (a log may hold earlier builds); milliseconds
  awk 'NR > 1 { took[$4] = ($2 - $1) / 1000 } END { for (o in took) print took[o], o }' "$log" | slowest "compile steps"
else
  echo "no $log (built without Ninja): no compile times"
fi
if [[ -f $costs ]]; then  # "name runs seconds" lines, then "---" and the failed tests
  awk '/^---/ { exit } NF == 3 { print $3, $1 }' "$costs" | slowest "tests"
else
  echo "no $costs: no test times"
fi

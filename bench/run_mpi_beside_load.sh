#!/usr/bin/env bash
# The floor under scripts/stress.sh's MPI tests: a one-integer MPI_Allreduce on 4 ranks of plain MPI
# (bench_mpi_beside_load), quiet and beside one busy loop per core at nice 0, 10 and 19; with TEST_BUILD (a build
# with the test suite), test_mpi_llama_pipeline.mpi4 beside the same loads too (cut off at 120 s).
#   bench/run_mpi_beside_load.sh BENCH_BUILD [TEST_BUILD]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/openblas_env.sh"  # the kernels the CPU can run
bench=$1/bench/bench_mpi_beside_load
tests=${2:-}
[[ -x $bench ]] || { echo "run_mpi_beside_load.sh: build $bench first (target bench_mpi_beside_load)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
launch=(mpiexec -n 4 --oversubscribe --bind-to none)
loops=()
stop_loops() {
  local p
  for p in "${loops[@]}"; do kill "$p" 2>/dev/null || true; done
  loops=()
}
trap stop_loops EXIT
for load in quiet 0 10 19; do
  if [[ $load != quiet ]]; then
    for ((i = 0; i < $(nproc); ++i)); do
      nice -n "$load" bash -c 'while :; do :; done' &
      loops+=($!)
    done
    label="beside $(nproc) busy loops at nice $load"
  else
    label="quiet"
  fi
  sleep 1
  echo "== $label: $("${launch[@]}" "$bench" 5)"
  if [[ -n $tests ]]; then
    started=$(date +%s.%N)
    status=passed
    timeout 120 "${launch[@]}" "$tests/tests/test_llama_pipeline" --no-colors \
      "--source-file=*/test_mpi_llama_pipeline.cpp" >/dev/null 2>&1 || status="stopped or failed"
    awk -v s="$started" -v e="$(date +%s.%N)" -v t="$status" \
      'BEGIN { printf "   test_mpi_llama_pipeline.mpi4: %.1f s (%s)\n", e - s, t }'
  fi
  stop_loops
done

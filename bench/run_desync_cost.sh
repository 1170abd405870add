#!/usr/bin/env bash
# The cost of the desync check (issue 35) on healthy runs: bench_collectives (MPI and thread mesh, 2 ranks)
# and bench_train_llama (thread mesh, TP 1 and TP 2, dim 256 and dim 1024) built from BASE (the last commit
# without the check) and from this tree, run in turn in one sitting, ROUNDS times each. Prints each run's
# numbers; compare the medians. The side that runs first alternates from round to round.
#   bench/run_desync_cost.sh [BASE] [ROUNDS]
# COLLECTIVES=0 in the environment: bench_train_llama only (to add rounds to its noisier numbers).
set -euo pipefail
collectives=${COLLECTIVES:-1}
base=${1:-5d5c136}
rounds=${2:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/shardwise-desync-XXXXXX)
trap 'git -C "$here" worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git -C "$here" worktree add --detach -q "$work/base" "$base"
for side in base head; do
  src=$here
  [ "$side" = base ] && src=$work/base
  cmake -S "$src" -B "$work/build-$side" -DCMAKE_BUILD_TYPE=Release -DSHARDWISE_BUILD_TESTS=OFF \
    -DSHARDWISE_BUILD_EXAMPLES=OFF -DSHARDWISE_BUILD_BENCH=ON >/dev/null
  targets=(bench_train_llama)
  [ "$collectives" = 1 ] && targets+=(bench_collectives)
  cmake --build "$work/build-$side" -j2 --target "${targets[@]}" >/dev/null
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader \
  OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1
echo "# $(date -u '+%Y-%m-%d %H:%M') UTC, $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "# base $(git -C "$here" rev-parse --short "$base") against head $(git -C "$here" rev-parse --short HEAD) (+ working tree)"
large=(--vocabulary 8192 --dim 1024 --layers 2 --heads 16 --kv-heads 8 --hidden 2816)
for round in $(seq "$rounds"); do
  order="base head"
  [ $((round % 2)) = 0 ] && order="head base"  # alternated, so that drift within a round favours neither side
  for side in $order; do
    bin=$work/build-$side/bench
    if [ "$collectives" = 1 ]; then
      echo "## round $round, $side: bench_collectives (all_reduce, all_gather rows: size | raw | sw-MPI | sw/raw | thread µs)"
      mpiexec -n 2 --bind-to none "$bin/bench_collectives" | grep -E '^\| [0-9]+ [KM]iB \|'
    fi
    echo "## round $round, $side: bench_train_llama tokens/s, dim 256 (TP 1, TP 2) and dim 1024 (TP 1, TP 2)"
    "$bin/bench_train_llama" --steps 5 --configurations 0,1 | grep '^RESULT shardwise'
    "$bin/bench_train_llama" --steps 3 --configurations 0,1 "${large[@]}" | grep '^RESULT shardwise'
  done
done

#!/usr/bin/env bash
# The cost of checking that ranks agree on every collective call (issue 12): bench_collectives built from
# BASE (the last commit before the check, 7fcab7c by default) and from this tree, run alternately in one
# session, ROUNDS times each (3 by default). Prints both runs' per-call times and the after/before ratios.
# Then the thread mesh A/B in one process (bench/agreement_ab.cpp: both commits' collectives linked side by
# side, alternating short batches), and the same harness with BASE on both sides (A/A: its own noise floor).
#   bench/run_agreement_cost.sh [BASE] [ROUNDS]
set -euo pipefail
base=${1:-7fcab7c}
rounds=${2:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/shardwise-agreement-XXXXXX)
trap 'git -C "$here" worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git -C "$here" worktree add --detach -q "$work/base" "$base"
for side in base head; do
  src=$here
  [ "$side" = base ] && src=$work/base
  cmake -S "$src" -B "$work/build-$side" -DCMAKE_BUILD_TYPE=Release -DSHARDWISE_BUILD_TESTS=OFF \
    -DSHARDWISE_BUILD_EXAMPLES=OFF -DSHARDWISE_BUILD_BENCH=ON >/dev/null
  cmake --build "$work/build-$side" -j2 --target bench_collectives >/dev/null
done
# The in-process A/B: agreement_side.cpp compiled against each side's headers, the namespace renamed per side.
side_flags=(-O3 -DNDEBUG -march=native -std=gnu++20 -isystem /usr/include/eigen3)
g++ "${side_flags[@]}" -DSIDE=shardwise_base -I"$work/base/include" -c "$here/bench/agreement_side.cpp" -o "$work/base.o"
g++ "${side_flags[@]}" -DSIDE=shardwise_head -I"$here/include" -c "$here/bench/agreement_side.cpp" -o "$work/head.o"
g++ "${side_flags[@]}" -DSIDE=shardwise_head -I"$work/base/include" -c "$here/bench/agreement_side.cpp" -o "$work/aa.o"
g++ -O3 -std=gnu++20 "$here/bench/agreement_ab.cpp" "$work/base.o" "$work/head.o" -o "$work/ab" -pthread
g++ -O3 -std=gnu++20 "$here/bench/agreement_ab.cpp" "$work/base.o" "$work/aa.o" -o "$work/aa" -pthread
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader \
  OMPI_MCA_rmaps_base_oversubscribe=1
echo "# $(date -u '+%Y-%m-%d %H:%M') UTC, $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "# base $(git -C "$here" rev-parse --short "$base") against head $(git -C "$here" rev-parse --short HEAD) (+ working tree)"
for round in $(seq "$rounds"); do
  for side in base head; do
    mpiexec -n 2 --bind-to none "$work/build-$side/bench/bench_collectives" >"$work/$side.$round.md"
  done
done
# Table rows: | size | raw µs | sw-MPI µs | sw-MPI/raw | thread-mesh µs | ...; first table all_reduce, second all_gather.
python3 - "$work" "$rounds" <<'PY'
import sys, statistics
work, rounds = sys.argv[1], int(sys.argv[2])
def tables(path):
    out, current = [], None
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip('|').split('|')]
        if line.startswith('| size'):
            current = {}
            out.append(current)
        elif current is not None and line.startswith('| ') and cells[0].endswith(('KiB', 'MiB')):
            current[cells[0]] = (float(cells[3]), float(cells[4]))  # sw-MPI/raw, thread-mesh µs
    return out[:2]
runs = {side: [tables(f"{work}/{side}.{r}.md") for r in range(1, rounds + 1)] for side in ('base', 'head')}
for t, name in enumerate(('all_reduce', 'all_gather')):
    print(f"\n{name} (2 ranks; medians over {rounds} runs of each side)\n")
    print("| size | sw-MPI/raw before | after | after/before | thread µs before | after | after/before |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for size in runs['base'][0][t]:
        b = [r[t][size] for r in runs['base']]; h = [r[t][size] for r in runs['head']]
        mb, mh = statistics.median(x[0] for x in b), statistics.median(x[0] for x in h)
        tb, th = statistics.median(x[1] for x in b), statistics.median(x[1] for x in h)
        print(f"| {size} | {mb:.3f} | {mh:.3f} | {mh / mb:.3f} | {tb:.2f} | {th:.2f} | {th / tb:.3f} |")
PY
echo
echo "## Thread mesh, in one process: base against this tree"
"$work/ab" 101
echo
echo "## Each side alone (4 KiB all-reduce, long runs): the per-call constant"
"$work/ab" alone
echo
echo "## The same harness with base on both sides (A/A): what it reads when nothing differs"
"$work/aa" 101

#!/usr/bin/env bash
# Run time of two builds of the benchmarks side by side, in one sitting: bench_train_llama at dim 1024 (TP 1 and
# TP 2, alternating A and B --rounds times), then bench_fsdp and bench_pipeline once each, A then B. Use it to show
# that a change to how the library is built or organised left the training step's speed where it was.
#   bench/run_ab.sh BUILD_A BUILD_B [--rounds N]
# Each BUILD is a build folder with bench_train_llama, bench_fsdp and bench_pipeline built (their default -O3
# -march=native); run it on a quiet machine.
set -euo pipefail
a=${1:?usage: run_ab.sh BUILD_A BUILD_B [--rounds N]}
b=${2:?usage: run_ab.sh BUILD_A BUILD_B [--rounds N]}
rounds=3
[ "${3:-}" = "--rounds" ] && rounds=${4:?--rounds needs a number}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1  # one thread per rank, BLAS included
source "$(dirname "${BASH_SOURCE[0]}")/openblas_env.sh"  # the kernels the CPU can run
echo "# $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(nproc --all) cores, load $(cut -d' ' -f1-3 /proc/loadavg); A = $a, B = $b"
results() { grep '^RESULT' | cut -d' ' -f2- | tr '\n' ' '; }
for round in $(seq "$rounds"); do
  for build in "$a" "$b"; do
    echo "train_llama dim 1024, round $round, $build: $("$build/bench/bench_train_llama" --steps 3 --configurations 0,1 \
      --dim 1024 --hidden 2816 --heads 16 --kv-heads 8 --layers 4 | results)"
  done
done
for build in "$a" "$b"; do
  echo "fsdp, $build: $("$build/bench/bench_fsdp" --steps 3 --rounds 1 2>&1 | results)"
done
for build in "$a" "$b"; do
  echo "pipeline, $build: $("$build/bench/bench_pipeline" --steps 2 --rounds 1 2>&1 | results)"
done
echo "# done $(date -u '+%H:%M:%S UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"

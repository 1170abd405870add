#!/usr/bin/env bash
# One run, side by side: shardwise vs hand-written vs TP 1 (bench_tp_mlp), then PyTorch's own TP on gloo.
#   bench/run_tp_mlp.sh BUILD_DIR [same options as bench_tp_mlp]
set -euo pipefail
build=${1:?usage: run_tp_mlp.sh BUILD_DIR [options]}
shift
here=$(cd "$(dirname "$0")" && pwd)
python=$(bash "$here/../scripts/torch-venv.sh")
echo "# $(date -u +%Y-%m-%d), $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1  # one thread per rank, BLAS included
source "$(dirname "${BASH_SOURCE[0]}")/openblas_env.sh"  # the kernels the CPU can run
shardwise_out=$("$build/bench/bench_tp_mlp" "$@")
echo "$shardwise_out" | grep -v '^RESULT'
torch_out=$("$python" "$here/torch_tp_mlp.py" "$@" | grep -v '^$')
echo "$torch_out" | grep -v '^RESULT'
ours=$(echo "$shardwise_out" | awk '/^RESULT/ {print $3}')
theirs=$(echo "$torch_out" | awk '/^RESULT/ {print $3}')
echo "shardwise / PyTorch tokens/s at TP 2: $(awk -v a="$ours" -v b="$theirs" 'BEGIN {printf "%.2f", a / b}') (target >= 1.1)"

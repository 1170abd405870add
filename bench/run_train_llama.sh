#!/usr/bin/env bash
# One run, side by side: shardwise's Llama training at TP 1, 2, 4 and dp 2 x tp 2 (bench_train_llama, thread mesh,
# each configuration in its own process), then PyTorch's own TP at TP 2 on the same model and plan
# (torch_train_llama.py: transformers' LlamaForCausalLM, parallelize_module, gloo) and unsharded, and the ratio at
# TP 2.
#   bench/run_train_llama.sh BUILD_DIR [--steps N]
# SHARDWISE_PYTHON overrides the interpreter (default: scripts/torch-venv.sh's).
set -euo pipefail
build=${1:?usage: run_train_llama.sh BUILD_DIR [--steps N]}
shift
steps=10
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=${2:?--steps needs a number}; shift 2 ;;
    *) echo "usage: run_train_llama.sh BUILD_DIR [--steps N]" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
python=${SHARDWISE_PYTHON:-$(bash "$here/../scripts/torch-venv.sh")}
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
     "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1  # one thread per rank, BLAS included
source "$(dirname "${BASH_SOURCE[0]}")/openblas_env.sh"  # the kernels the CPU can run
shardwise_out=$("$build/bench/bench_train_llama" --steps "$steps")
echo "$shardwise_out" | grep -v '^RESULT'
echo
torch_out=$("$python" "$here/torch_train_llama.py" --tp 2 --steps "$steps" | grep -v '^$')
echo "$torch_out" | grep -v '^RESULT'
# PyTorch unsharded, for its own TP 2 / TP 1 (one process, one thread)
"$python" "$here/torch_train_llama.py" --tp 1 --steps "$steps" --no-header | grep -v -e '^RESULT' -e '^#' -e '^$'
ours=$(echo "$shardwise_out" | awk '/^RESULT shardwise_tp2/ {print $3}')
theirs=$(echo "$torch_out" | awk '/^RESULT torch_tp2/ {print $3}')
echo
echo "shardwise / PyTorch training tokens/s at TP 2: $(awk -v a="$ours" -v b="$theirs" 'BEGIN {printf "%.2f", a / b}')" \
     "($ours / $theirs); load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

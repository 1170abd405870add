#!/usr/bin/env bash
# Long sequences at a realistic size, side by side in one run: shardwise's Llama training at TP 1 and TP 2 (thread
# mesh, sequence parallel; bench_train_llama), optionally the same bench built before the blocked attention, and
# PyTorch's at TP 1 and TP 2 (transformers' LlamaForCausalLM, torchtitan's plan, gloo) with the eager and the
# SDPA attention. Llama vocabulary 8192, dim 1024, 2 layers, 16 heads / 8 key-value heads, hidden 2816, fp32;
# 4 sequences of 256 tokens, 1 of 2048, 1 of 4096 per step. Tokens/s and peak RSS per rank.
#   bench/run_long_sequence.sh BUILD_DIR [--steps N] [--before BENCH_TRAIN_LLAMA] [--lengths "256x4 2048x1 4096x1"]
# SHARDWISE_PYTHON overrides the interpreter (default: scripts/torch-venv.sh's).
set -euo pipefail
build=${1:?usage: run_long_sequence.sh BUILD_DIR [--steps N] [--before BENCH_TRAIN_LLAMA] [--lengths LIST]}
shift
steps=3
before=""
lengths="256x4 2048x1 4096x1"
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=${2:?--steps needs a number}; shift 2 ;;
    --before) before=${2:?--before needs a bench_train_llama binary}; shift 2 ;;
    --lengths) lengths=${2:?--lengths needs a list like "2048x1 4096x1"}; shift 2 ;;
    *) echo "usage: run_long_sequence.sh BUILD_DIR [--steps N] [--before BENCH_TRAIN_LLAMA] [--lengths LIST]" >&2
       exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
python=${SHARDWISE_PYTHON:-$(bash "$here/../scripts/torch-venv.sh")}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1  # one thread per rank, BLAS included
source "$(dirname "${BASH_SOURCE[0]}")/openblas_env.sh"  # the kernels the CPU can run
model="--vocabulary 8192 --dim 1024 --layers 2 --heads 16 --kv-heads 8 --hidden 2816"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
     "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $steps timed steps after 1-2 warm-up"
for length in $lengths; do
  sequence=${length%x*}
  sequences=${length#*x}
  shape="$model --sequence $sequence --sequences $sequences"
  echo
  echo "## $sequences x $sequence tokens per step"
  echo "### shardwise"
  "$build/bench/bench_train_llama" --steps "$steps" --configurations 0,1 $shape | grep -v '^RESULT'
  if [ -n "$before" ]; then
    echo "### shardwise before the blocked attention"
    "$before" --steps "$steps" --configurations 0,1 $shape | grep -v '^RESULT'
  fi
  for attention in eager sdpa; do
    echo "### PyTorch, attention $attention"
    "$python" "$here/torch_train_llama.py" --tp 1 --steps "$steps" --warmup 1 --attention "$attention" $shape \
      | grep -v -e '^RESULT' -e '^$'
    "$python" "$here/torch_train_llama.py" --tp 2 --steps "$steps" --warmup 1 --attention "$attention" $shape \
      --no-header | grep -v -e '^RESULT' -e '^$'
  done
done
echo
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

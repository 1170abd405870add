#!/usr/bin/env bash
# One run, side by side: bench_pipeline's step times, bubbles and tokens/s (thread mesh), each stage's peak
# activation memory for GPipe, 1F1B and 1F1B with activation checkpointing per stage and per block (mpiexec -n 2
# and -n 4: one process per stage), then PyTorch's torch.distributed.pipelining Schedule1F1B and
# ScheduleInterleavedZeroBubble (ZB-H1), ScheduleZBVZeroBubble and ScheduleDualPipeV at pp 2 on the same model and batch
# (torch_pipeline.py: transformers' LlamaForCausalLM split into two stages, gloo), and the ratio.
#   bench/run_pipeline.sh BUILD_DIR [--small]
# SHARDWISE_PYTHON overrides the interpreter (default: scripts/torch-venv.sh's).
set -euo pipefail
ratios=()
build=${1:?usage: run_pipeline.sh BUILD_DIR [--small]}
shift
size=()
[ "${1:-}" = "--small" ] && size=(--small)
here=$(cd "$(dirname "$0")" && pwd)
python=${SHARDWISE_PYTHON:-$(bash "$here/../scripts/torch-venv.sh")}
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
     "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
source "$(dirname "${BASH_SOURCE[0]}")/openblas_env.sh"  # the kernels the CPU can run
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
ours=$("$build/bench/bench_pipeline" "${size[@]}")
echo "$ours" | grep -v '^RESULT'
echo
echo "# peak activation memory per stage, m = 8 (mpiexec, one process per stage)"
for n in 2 4; do
  for mode in gpipe 1f1b 1f1b-recompute 1f1b-blocks; do
    mpiexec -n "$n" --bind-to none "$build/bench/bench_pipeline" memory "$mode" "${size[@]}" | sed 's/^RESULT memory //' | sort
  done
done
echo
for schedule in 1f1b zbh1 zbv dualpipev; do
  theirs=$("$python" "$here/torch_pipeline.py" --schedule "$schedule" "${size[@]}")
  echo "$theirs" | grep -v '^RESULT'
  a=$(echo "$ours" | awk -v s="$schedule" '$2 == "pp2_" s "_m8" {print $3}')
  b=$(echo "$theirs" | awk -v s="$schedule" '$2 == "torch_pp2_" s "_m8" {print $3}')
  ratios+=("pp 2, $schedule, m = 8: shardwise $a tokens/s, PyTorch pipelining $b tokens/s: shardwise / PyTorch = $(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.2f", a / b}')")
done
echo
printf '%s\n' "${ratios[@]}"

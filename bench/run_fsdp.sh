#!/usr/bin/env bash
# One run, side by side: bench_fsdp's tokens/s of FSDP's strategies at dp 2 beside plain data parallelism and one
# rank (thread mesh), then PyTorch's fully_shard (FSDP2) at dp 2 on the same model and batch (torch_fsdp.py:
# transformers' LlamaForCausalLM, gloo), the ratio, and each rank's memory under full shard at dp 1, 2 and 4
# (mpiexec: one process per rank), each strategy with and without prefetch on MPI at dp 2, and each rank's memory
# while loading a consolidated file, every rank reading its rows against only_rank0_reads.
#   bench/run_fsdp.sh BUILD_DIR [--small]
# SHARDWISE_PYTHON overrides the interpreter (default: scripts/torch-venv.sh's).
set -euo pipefail
build=${1:?usage: run_fsdp.sh BUILD_DIR [--small]}
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
ours=$("$build/bench/bench_fsdp" "${size[@]}")
echo "$ours" | grep -v '^RESULT'
theirs_full=$("$python" "$here/torch_fsdp.py" "${size[@]}" --reshard-after-forward 1)
theirs_op=$("$python" "$here/torch_fsdp.py" "${size[@]}" --reshard-after-forward 0)
echo "$theirs_full" | grep -v '^RESULT'
echo "$theirs_op" | grep -v '^RESULT'
a=$(echo "$ours" | awk '/^RESULT .* 4 / {print $4}')
b=$(echo "$theirs_full" | awk '/^RESULT torch_fsdp/ {print $4}')
c=$(echo "$ours" | awk '/^RESULT .* 3 / {print $4}')
d=$(echo "$theirs_op" | awk '/^RESULT torch_fsdp/ {print $4}')
echo
echo "full shard, dp 2: shardwise $a tokens/s, PyTorch fully_shard $b: shardwise / PyTorch = $(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.2f", a / b}')"
echo "shard-grad-op, dp 2: shardwise $c tokens/s, PyTorch (reshard_after_forward=False) $d: shardwise / PyTorch = $(awk -v a="$c" -v b="$d" 'BEGIN {printf "%.2f", a / b}')"
echo
echo "# memory per rank, full shard at dp = ranks (mpiexec, one process per rank)"
echo "| ranks | rank | held: params + grads + AdamW state (MiB) | ideal: 4 x total / dp (MiB) | held / ideal | largest unit gathered (MiB) | RSS after a step, above the start (MiB) | peak RSS in a step, above the start (MiB) | shardwise plan predicts (MiB) | peak / predicted |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for n in 1 2 4; do
  mpiexec -n "$n" --bind-to none "$build/bench/bench_fsdp" memory "${size[@]}"
done
echo
mpiexec -n 2 --bind-to none "$build/bench/bench_fsdp" prefetch "${size[@]}"
echo
echo "# a model declared with sw::Lazy, fully sharded (dp x tp), then loading a consolidated model.safetensors into it (mpiexec), alternating, twice"
echo "| step | dp x tp | rank | parameter shard (MiB) | largest tensor (MiB) | RSS before the step, above the process's start (MiB) | peak RSS in the step, above the RSS before it (MiB) | that / (shard + largest) | seconds |"
echo "|---|---|---|---|---|---|---|---|---|"
for n in 2 4; do
  mpiexec -n "$n" --bind-to none "$build/bench/bench_fsdp" load "${size[@]}"
done
mpiexec -n 4 --bind-to none "$build/bench/bench_fsdp" load --tp 2 "${size[@]}"

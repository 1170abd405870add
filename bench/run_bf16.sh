#!/usr/bin/env bash
# One sitting, side by side: Llama training at dim 1024 (4 x 256 tokens a step), TP 1 and 2 on the thread mesh, in fp32
# and under sw::bf16_autocast (bench_train_llama --compute), and PyTorch's same model and plan in fp32 and under
# torch.autocast("cpu", torch.bfloat16) (torch_train_llama.py --autocast, scaled_dot_product_attention); then the
# ratios: bf16 / fp32 for each, and shardwise bf16 / PyTorch bf16. Each precision's runs of both follow one another,
# in `--rounds` rounds (default 2), each round's ratios its own: a shared host's speed drifts over minutes, so a ratio
# is taken between runs minutes apart at most.
#   bench/run_bf16.sh BUILD_DIR [--steps N] [--rounds R]
# SHARDWISE_PYTHON overrides the interpreter (default: scripts/torch-venv.sh's).
set -euo pipefail
build=${1:?usage: run_bf16.sh BUILD_DIR [--steps N] [--rounds R]}
shift
steps=5 rounds=2
while (($#)); do
  case $1 in
    --steps) steps=${2:?--steps needs a number}; shift 2 ;;
    --rounds) rounds=${2:?--rounds needs a number}; shift 2 ;;
    *) echo "run_bf16.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
python=${SHARDWISE_PYTHON:-$(bash "$here/../scripts/torch-venv.sh")}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1  # one thread per rank, oneDNN's and BLAS's included
source "$(dirname "${BASH_SOURCE[0]}")/openblas_env.sh"  # the kernels the CPU can run
model=(--vocabulary 8192 --dim 1024 --layers 2 --heads 16 --kv-heads 8 --hidden 2816 --sequence 256 --sequences 4)
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
     "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A rate
for round in $(seq "$rounds"); do
  echo "## round $round"
  for compute in fp32 bf16; do
    out=$("$build/bench/bench_train_llama" --steps "$steps" --configurations 0,1 "${model[@]}" --compute "$compute")
    grep -E '^# Llama|^\| TP|^core peak' <<<"$out"
    rate[ours,$compute,1]=$(awk '/^RESULT shardwise_tp1/ {print $3}' <<<"$out")
    rate[ours,$compute,2]=$(awk '/^RESULT shardwise_tp2/ {print $3}' <<<"$out")
    flag=()
    [[ $compute == bf16 ]] && flag=(--autocast)
    for tp in 1 2; do
      out=$("$python" "$here/torch_train_llama.py" --tp "$tp" --steps "$steps" "${model[@]}" --attention sdpa "${flag[@]}")
      grep -E '^# PyTorch|^\| PyTorch' <<<"$out"
      rate[torch,$compute,$tp]=$(awk '/^RESULT torch_tp/ {print $3}' <<<"$out")
    done
  done
  echo
  for tp in 1 2; do
    awk -v round="$round" -v tp="$tp" -v o32="${rate[ours,fp32,$tp]}" -v o16="${rate[ours,bf16,$tp]}" \
        -v t32="${rate[torch,fp32,$tp]}" -v t16="${rate[torch,bf16,$tp]}" 'BEGIN {
      printf "round %s, TP %s: shardwise bf16 / fp32 %.2fx (%.0f / %.0f tokens/s); PyTorch autocast / fp32 %.2fx (%.0f / %.0f);", round, tp, o16 / o32, o16, o32, t16 / t32, t16, t32
      printf " shardwise bf16 / PyTorch autocast %.2fx; shardwise fp32 / PyTorch fp32 %.2fx\n", o16 / t16, o32 / t32 }'
  done
  echo "# load average after round $round: $(cut -d' ' -f1-3 /proc/loadavg)"
done

#!/usr/bin/env bash
# One run, side by side: a Mixtral-like model (dim 1024, 2 layers, 16 heads, 8 key-value heads, 8 experts top-2 of
# hidden 1408, vocabulary 8192, fp32; 4 rows of 256 tokens per step) trained as a user's program does it — load the
# save_pretrained folder, train, save with the optimizer state, load back — by shardwise on 2 thread ranks that are
# the data-parallel ranks, with the experts placed over them (ep 2) and with every expert on every rank, and by
# transformers' Mixtral (eager experts) + torch on 2 threads; the dense Llama of the same active parameters per token
# (hidden 2 x 1408) by both; each in its own process. Then the ratios, and the experts' exchange
# (sw::all_to_all_rows) at ep 2 and 4 against every rank copying the same bytes.
#   bench/run_moe.sh BUILD_DIR [FOLDER_DIR] [--steps N]
# FOLDER_DIR keeps the two model folders between runs (written once by torch_moe.py --write-folder).
# SHARDWISE_PYTHON overrides the interpreter (default: scripts/torch-venv.sh's).
set -euo pipefail
build=${1:?usage: run_moe.sh BUILD_DIR [FOLDER_DIR] [--steps N]}
shift
folders=/tmp/shardwise-moe-bench-models
[ $# -gt 0 ] && [[ $1 != --* ]] && { folders=$1; shift; }
steps=5
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=${2:?--steps needs a number}; shift 2 ;;
    *) echo "usage: run_moe.sh BUILD_DIR [FOLDER_DIR] [--steps N]" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
python=${SHARDWISE_PYTHON:-$(bash "$here/../scripts/torch-venv.sh")}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
source "$(dirname "${BASH_SOURCE[0]}")/openblas_env.sh"  # the kernels the CPU can run
[ -f "$folders/moe/config.json" ] || "$python" "$here/torch_moe.py" --write-folder "$folders/moe"
[ -f "$folders/dense/config.json" ] || "$python" "$here/torch_moe.py" --write-folder "$folders/dense" --dense
bench="$build/bench/bench_moe"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
     "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $steps steps after one of warm-up"
echo "| run | tokens/s | load s | save s | reload s | peak RSS MiB per rank | MFU |"
echo "|---|---|---|---|---|---|---|"
results=""
keep() { echo "$1" | grep -v '^RESULT'; results+="$1"$'\n'; }
keep "$("$bench" --folder "$folders/moe" --ep --ranks 2 --steps "$steps" --out /tmp/shardwise-moe-bench-ep)"
keep "$("$bench" --folder "$folders/moe" --ranks 2 --steps "$steps" --out /tmp/shardwise-moe-bench-replicated)"
keep "$("$bench" --folder "$folders/dense" --dense --ranks 2 --steps "$steps" --out /tmp/shardwise-moe-bench-dense)"
keep "$("$python" "$here/torch_moe.py" --folder "$folders/moe" --threads 2 --steps "$steps" 2>/dev/null)"
keep "$("$python" "$here/torch_moe.py" --folder "$folders/dense" --dense --threads 2 --steps "$steps" 2>/dev/null)"
rm -rf /tmp/shardwise-moe-bench-ep /tmp/shardwise-moe-bench-replicated /tmp/shardwise-moe-bench-dense
echo
echo "| exchange | rows x dim (float) | MiB per rank | ms | GB/s sent per rank | memcpy of the same bytes, ms | exchange / memcpy, time |"
echo "|---|---|---|---|---|---|---|"
keep "$("$bench" --exchange --ranks 2 --rows 1024 --dim 1024)"
keep "$("$bench" --exchange --ranks 4 --rows 512 --dim 1024)"
value() { echo "$results" | awk -v key="RESULT $1" -v field="$2" '$0 ~ "^"key" " {print $field}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
echo
echo "shardwise ep 2 / transformers + torch (2 threads), tokens/s: $(ratio "$(value shardwise_ep_2 3)" "$(value torch_moe_2 3)")"
echo "shardwise ep 2 / every expert on every rank: tokens/s $(ratio "$(value shardwise_ep_2 3)" "$(value shardwise_replicated_2 3)")," \
     "peak RSS $(ratio "$(value shardwise_ep_2 4)" "$(value shardwise_replicated_2 4)")"
echo "mixture of experts / the dense model of the same active parameters, tokens/s: shardwise" \
     "$(ratio "$(value shardwise_ep_2 3)" "$(value shardwise_dense_2 3)"), transformers + torch" \
     "$(ratio "$(value torch_moe_2 3)" "$(value torch_dense_2 3)")"
echo "shardwise dense / transformers + torch dense, tokens/s: $(ratio "$(value shardwise_dense_2 3)" "$(value torch_dense_2 3)")"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

#!/usr/bin/env bash
# One run, side by side: a LoRA fine-tuning run (r 16 on q, k, v, o) and a full fine-tuning run of the same Llama
# (dim 1024, 4 layers, 16 heads, 4 key-value heads, hidden 2816, vocabulary 16384, fp32; 4 rows of 256 tokens, a
# quarter of each a masked prompt), each as a user's program does it — load the save_pretrained folder, train, save,
# load back — by shardwise (bench_finetune, tp 1 and tp 2 on threads) and by peft + torch (torch_finetune.py, 1 and
# 2 threads); each in its own process. Then the ratios: LoRA / full for each, shardwise / peft for LoRA.
#   bench/run_finetune.sh BUILD_DIR [FOLDER_DIR] [--steps N]
# FOLDER_DIR keeps the model folder between runs (written once by torch_finetune.py --write-folder).
# SHARDWISE_PYTHON overrides the interpreter (default: scripts/torch-venv.sh's).
set -euo pipefail
build=${1:?usage: run_finetune.sh BUILD_DIR [FOLDER_DIR] [--steps N]}
shift
folder=/tmp/shardwise-finetune-bench-model
[ $# -gt 0 ] && [[ $1 != --* ]] && { folder=$1; shift; }
steps=5
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=${2:?--steps needs a number}; shift 2 ;;
    *) echo "usage: run_finetune.sh BUILD_DIR [FOLDER_DIR] [--steps N]" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
python=${SHARDWISE_PYTHON:-$(bash "$here/../scripts/torch-venv.sh")}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
source "$(dirname "${BASH_SOURCE[0]}")/openblas_env.sh"  # the kernels the CPU can run
[ -f "$folder/config.json" ] || "$python" "$here/torch_finetune.py" --write-folder "$folder"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
     "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $steps steps after one of warm-up"
echo "| run | tokens/s | load s | save s | reload s | optimizer state MiB | peak RSS MiB per rank | its products alone, tokens/s | MFU |"
echo "|---|---|---|---|---|---|---|---|---|"
results=""
for run in "lora 1" "full 1" "lora 2"; do
  set -- $run
  out=$("$build/bench/bench_finetune" --folder "$folder" --mode "$1" --tp "$2" --steps "$steps")
  echo "$out" | grep -v '^RESULT'
  results+="$out"$'\n'
  out=$("$python" "$here/torch_finetune.py" --folder "$folder" --mode "$1" --threads "$2" --steps "$steps" 2>/dev/null)
  echo "$out" | grep -v '^RESULT'
  results+="$out"$'\n'
done
value() { echo "$results" | awk -v key="RESULT $1" -v field="$2" '$0 ~ "^"key" " {print $field}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
echo
echo "shardwise LoRA / full fine-tuning: tokens/s $(ratio "$(value shardwise_lora_tp1 3)" "$(value shardwise_full_tp1 3)")," \
     "peak RSS $(ratio "$(value shardwise_lora_tp1 4)" "$(value shardwise_full_tp1 4)") (tp 1)"
echo "peft LoRA / torch full fine-tuning: tokens/s $(ratio "$(value torch_lora_threads1 3)" "$(value torch_full_threads1 3)")," \
     "peak RSS $(ratio "$(value torch_lora_threads1 4)" "$(value torch_full_threads1 4)") (1 thread)"
echo "shardwise / peft, LoRA tokens/s: $(ratio "$(value shardwise_lora_tp1 3)" "$(value torch_lora_threads1 3)") (tp 1 vs 1 thread)," \
     "$(ratio "$(value shardwise_lora_tp2 3)" "$(value torch_lora_threads2 3)") (tp 2 vs 2 threads)"
echo "the LoRA step / its products alone (the floor of any fp32 step): shardwise $(ratio "$(value shardwise_lora_tp1 3)" "$(value shardwise_lora_tp1 5)")," \
     "peft $(ratio "$(value torch_lora_threads1 3)" "$(value shardwise_lora_tp1 5)") (1 thread);" \
     "shardwise $(ratio "$(value shardwise_lora_tp2 3)" "$(value shardwise_lora_tp2 5)"), peft $(ratio "$(value torch_lora_threads2 3)" "$(value shardwise_lora_tp2 5)") (2)"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

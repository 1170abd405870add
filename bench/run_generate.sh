#!/usr/bin/env bash
# One run, side by side: sw::generate (bench_generate, thread mesh, each configuration in its own process) and
# transformers' generate (torch_generate.py, as many torch threads as shardwise ranks) on the same LlamaForCausalLM
# save_pretrained folder (672 M parameters, fp32; written once into DIR), greedy, 128-token prompts, 32 new tokens,
# at batch 1 and 8 and 1 and 2 threads; then the ratios. bench_generate prints each configuration's share of the
# memory-bandwidth roofline it measured in the same process.
#   bench/run_generate.sh BUILD_DIR [DIR]
# SHARDWISE_PYTHON overrides the interpreter (default: scripts/torch-venv.sh's).
set -euo pipefail
build=${1:?usage: run_generate.sh BUILD_DIR [DIR]}
dir=${2:-/tmp/shardwise-bench-generate}
here=$(cd "$(dirname "$0")" && pwd)
python=${SHARDWISE_PYTHON:-$(bash "$here/../scripts/torch-venv.sh")}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
"$python" "$here/torch_generate.py" prepare "$dir"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
     "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A ours theirs
for batch in 1 8; do
  for n in 1 2; do
    line=$("$build/bench/bench_generate" --folder "$dir" --tp "$n" --batch "$batch" | tee /dev/stderr | grep '^RESULT')
    ours[$n,$batch]=$line
    line=$("$python" "$here/torch_generate.py" run "$dir" --threads "$n" --batch "$batch" | tee /dev/stderr | grep '^RESULT')
    theirs[$n,$batch]=$line
  done
done 2>&1
echo
for batch in 1 8; do
  for n in 1 2; do
    read -r _ _ our_first our_rate _ <<<"${ours[$n,$batch]}"
    read -r _ _ their_first their_rate _ <<<"${theirs[$n,$batch]}"
    awk -v n="$n" -v b="$batch" -v of="$our_first" -v orate="$our_rate" -v tf="$their_first" -v trate="$their_rate" \
      'BEGIN { printf "batch %d, %d thread(s): decode %.2f / %.2f tokens/s = %.2fx transformers; first token %.3f / %.3f s = %.2fx faster\n", b, n, orate, trate, orate / trate, of, tf, tf / of }'
  done
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

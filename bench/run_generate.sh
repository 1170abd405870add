#!/usr/bin/env bash
# One run, side by side: sw::generate (bench_generate, thread mesh, each configuration in its own process) and
# transformers' generate (torch_generate.py, as many torch threads as shardwise ranks) on the same LlamaForCausalLM
# save_pretrained folder (672 M parameters, fp32; written once into DIR), greedy, 128-token prompts, 32 new tokens,
# at batch 1 and 8 and 1 and 2 threads; then the ratios. bench_generate prints each configuration's share of the
# memory-bandwidth roofline it measured in the same process. Then the same at batch 1 on a small model (dim 256, 4
# layers; DIR-small), where per-token overhead rather than memory decides; and shardwise alone at one thread over
# batches 1 to 16 (decode tokens/s and roofline share as the batch grows); then bf16 weights at batch 1 and 8, 1 and 2
# threads: shardwise's sw::bf16_weights (fp32 activations and sums) against transformers in torch_dtype=bfloat16,
# and against shardwise's fp32 rows above, each beside the roofline of the bytes it reads.
#   bench/run_generate.sh BUILD_DIR [DIR]
# SHARDWISE_PYTHON overrides the interpreter (default: scripts/torch-venv.sh's).
set -euo pipefail
build=${1:?usage: run_generate.sh BUILD_DIR [DIR]}
dir=${2:-/tmp/shardwise-bench-generate}
here=$(cd "$(dirname "$0")" && pwd)
python=${SHARDWISE_PYTHON:-$(bash "$here/../scripts/torch-venv.sh")}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
source "$(dirname "${BASH_SOURCE[0]}")/openblas_env.sh"  # the kernels the CPU can run
"$python" "$here/torch_generate.py" prepare "$dir"
"$python" "$here/torch_generate.py" prepare "$dir-small" --small
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
     "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A ours theirs
run() {  # run KEY FOLDER THREADS BATCH [WEIGHTS]: WEIGHTS fp32 (the default) or bf16
  local out weights=${5:-fp32} dtype=float32
  [[ $weights == bf16 ]] && dtype=bfloat16
  out=$("$build/bench/bench_generate" --folder "$2" --tp "$3" --batch "$4" --weights "$weights")
  grep -v '^RESULT' <<<"$out"
  ours[$1]=$(grep '^RESULT' <<<"$out")
  out=$("$python" "$here/torch_generate.py" run "$2" --threads "$3" --batch "$4" --dtype "$dtype" 2>/dev/null)
  grep -v '^RESULT' <<<"$out"
  theirs[$1]=$(grep '^RESULT' <<<"$out")
}
for batch in 1 8; do
  for n in 1 2; do run "$n,$batch" "$dir" "$n" "$batch"; done
done
for batch in 2 4 16; do  # the batch sweep: shardwise alone, one thread
  out=$("$build/bench/bench_generate" --folder "$dir" --tp 1 --batch "$batch")
  grep -v '^RESULT' <<<"$out"
  ours["1,$batch"]=$(grep '^RESULT' <<<"$out")
done
echo "# bf16 weights"
for batch in 1 8; do
  for n in 1 2; do run "bf16,$n,$batch" "$dir" "$n" "$batch" bf16; done
done
echo "# small model ($dir-small)"
for n in 1 2; do run "small$n,1" "$dir-small" "$n" 1; done
echo
ratio() {  # ratio KEY LABEL
  local our_first our_rate bytes bandwidth their_first their_rate
  read -r _ _ our_first our_rate _ _ _ bytes bandwidth <<<"${ours[$1]}"
  read -r _ _ their_first their_rate _ <<<"${theirs[$1]}"
  awk -v label="$2" -v b="${1##*,}" -v of="$our_first" -v orate="$our_rate" -v tf="$their_first" \
      -v trate="$their_rate" -v bytes="$bytes" -v bw="$bandwidth" 'BEGIN {
    floor = bytes / bw  # seconds a decode step takes at the measured read bandwidth
    printf "%s: decode %.2f / %.2f tokens/s = %.2fx transformers (roofline share %.2f / %.2f);", label, orate, trate, orate / trate, floor * orate / b, floor * trate / b
    printf " first token %.3f / %.3f s = %.2fx faster\n", of, tf, tf / of }'
}
for batch in 1 8; do
  for n in 1 2; do ratio "$n,$batch" "batch $batch, $n thread(s)"; done
done
for batch in 1 8; do
  for n in 1 2; do
    ratio "bf16,$n,$batch" "bf16 weights (transformers bf16), batch $batch, $n thread(s)"
    read -r _ _ _ bf16_rate _ <<<"${ours[bf16,$n,$batch]}"
    read -r _ _ _ fp32_rate _ <<<"${ours[$n,$batch]}"
    awk -v b="$batch" -v n="$n" -v r16="$bf16_rate" -v r32="$fp32_rate" \
      'BEGIN { printf "bf16 against fp32 weights, batch %s, %s thread(s): %.2fx tokens/s\n", b, n, r16 / r32 }'
  done
done
for n in 1 2; do ratio "small$n,1" "small model, batch 1, $n thread(s)"; done
for batch in 1 2 4 8 16; do  # RESULT name first rate share ...: tokens/s and roofline share as the batch grows
  read -r _ _ _ rate share _ <<<"${ours[1,$batch]}"
  echo "batch sweep, 1 thread: batch $batch decode $rate tokens/s, roofline share $share"
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

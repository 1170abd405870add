#!/usr/bin/env bash
# Builds the fuzz target of every reader of outside input (one binary) with clang (libFuzzer + AddressSanitizer +
# UndefinedBehaviorSanitizer) in their own build folder (tests/fuzz) and runs each for SECONDS from its seeds:
#   safetensors_header  tests/fuzz/corpus (bad cases and good files, tests/fuzz/make_corpus.py)
#   checkpoint_index    tests/fuzz/seeds_index (a sharded checkpoint's shardwise_checkpoint.json)
#   pretrained_index    tests/fuzz/seeds_pretrained (a save_pretrained model.safetensors.index.json)
#   llama_config        tests/data (transformers' Llama 3, Qwen2, Qwen3, Mistral and GPT-2 config.json files, and a
#                       broken one), read as a Llama and a GPT-2 config and by the planner
#   machine_file        tools/machines (the planner's machine files)
#   peft_config         tests/fuzz/seeds_peft (adapter_config.json as peft and sw::save_lora write it)
#   scripts/fuzz.sh [SECONDS=60] [BUILD_DIR=build-fuzz] [TARGET...]
# New inputs go to BUILD_DIR/corpus_<target>; a finding is written to BUILD_DIR/crash-* and the script fails.
set -euo pipefail
seconds=${1:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${2:-$root/build-fuzz}
shift $(($# < 2 ? $# : 2))
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(safetensors_header checkpoint_index pretrained_index llama_config machine_file peft_config)
cxx=${SHARDWISE_FUZZ_CXX:-$(command -v clang++-14 || command -v clang++ || true)}
if [[ -z "$cxx" ]]; then
  echo "fuzz.sh: no clang++ found; run scripts/install-deps.sh (clang-14, libclang-rt-14-dev)" >&2
  exit 1
fi
cmake -S "$root/tests/fuzz" -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j2 --target readers_fuzz
cd "$build"
declare -A seeds=([safetensors_header]="$root/tests/fuzz/corpus" [checkpoint_index]="$root/tests/fuzz/seeds_index"
                  [pretrained_index]="$root/tests/fuzz/seeds_pretrained" [llama_config]="$root/tests/data"
                  [machine_file]="$root/tools/machines" [peft_config]="$root/tests/fuzz/seeds_peft")
for target in "${targets[@]}"; do
  mkdir -p "corpus_$target"
  dict=()
  [[ $target == safetensors_header ]] && dict=(-dict="$root/tests/fuzz/safetensors.dict")
  echo "fuzz.sh: $target for $seconds s"
  SHARDWISE_FUZZ_TARGET=$target ./readers_fuzz -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 "${dict[@]}" \
    -print_final_stats=1 "corpus_$target" "${seeds[$target]}"
done
echo "fuzz.sh: every target ran its time without a finding"

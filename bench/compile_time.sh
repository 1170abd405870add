#!/bin/bash
# The build time of a user's model files (docs/build-time.md): examples/train_llama.cpp (one plan) and
# bench/eight_variants.cpp (the Llama model in float and double under four layouts), compiled alone with g++ at -O2 and -O3, as a user's
# build compiles them: with the nn kernels compiled in the file, with them from shardwise::separate_kernels
# (-DSHARDWISE_SEPARATE_KERNELS), and with sw::launch's runtime from shardwise::separate_runtime as well
# (-DSHARDWISE_SEPARATE_RUNTIME), and with checkpoint IO from shardwise::separate_checkpoint as well
# (-DSHARDWISE_SEPARATE_CHECKPOINT; the libraries' own files, compiled once per build, are timed too). With
# --before REV the same files are also compiled against REV's headers. Each time is the fastest of --repeat runs
# (default 2), in seconds; run it on a quiet machine. With --per-plan it times instead what each plan adds to a
# program: bench/eight_variants.cpp with 1 to 4 plans in float (-DSHARDWISE_BENCH_PLANS=n), -O2, the three libraries.
# With --alternate (and --before) it compiles each file against REV's headers and this tree's in turn, --repeat
# times, -O2 with the three libraries, and prints every time: on a machine whose speed drifts from hour to hour, pairs
# taken minutes apart compare what one-off timings cannot. With --pch it times each file with and without a
# precompiled header of the shardwise headers it includes (-O2, the three libraries), as CMake's
# target_precompile_headers builds one, and the precompiled header's own build (once per target). With --parts it
# times bench/compile_parts.cpp with its parts switched on one after another (-DSHARDWISE_PARTS=0..9, -O2, the three
# libraries): what parsing, launching, the mesh, the model, parallelize, forward, backward, the optimizer and
# checkpoints each add to a one-plan program.
#
#   bench/compile_time.sh [--before REV] [--repeat N] [--compiler g++] [--files "examples/train_llama.cpp ..."]
#   bench/compile_time.sh --per-plan [--before REV] [--repeat N]
#   bench/compile_time.sh --alternate --before REV [--repeat N] [--files "..."]
#   bench/compile_time.sh --pch [--repeat N] [--files "..."]
#   bench/compile_time.sh --parts [--repeat N]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
before="" repeat=2 cxx=g++ files="examples/train_llama.cpp bench/eight_variants.cpp" per_plan="" alternate="" pch="" parts=""
while [ $# -gt 0 ]; do
  case "$1" in
    --before) before=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --compiler) cxx=$2; shift 2 ;;
    --files) files=$2; shift 2 ;;
    --per-plan) per_plan=1; shift ;;
    --alternate) alternate=1; shift ;;
    --pch) pch=1; shift ;;
    --parts) parts=1; shift ;;
    *) echo "compile_time.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpi_includes=$(mpicxx --showme:incdirs 2>/dev/null | sed 's/\([^ ]*\)/-isystem \1/g')
common="-std=gnu++20 -DNDEBUG -DEIGEN_USE_BLAS -isystem /usr/include/eigen3 $mpi_includes"

fastest() {  # fastest() include_dir source flags...: the fastest of $repeat compiles, in seconds
  local include=$1 source=$2 best=""
  shift 2
  for _ in $(seq "$repeat"); do
    local start end
    start=$(date +%s.%N)
    "$cxx" $common -I"$include" "$@" -c "$source" -o "$work/out.o"
    end=$(date +%s.%N)
    best=$(echo "$start $end ${best:-1e9}" | awk '{t = $2 - $1; print (t < $3 ? t : $3)}')
  done
  printf '%.1f' "$best"
}

# The flags of the modes that time a file with the three libraries linked.
libraries="-O2 -DSHARDWISE_SEPARATE_KERNELS -DSHARDWISE_SEPARATE_RUNTIME -DSHARDWISE_SEPARATE_CHECKPOINT"
added() {  # added NOW LAST: "+1.2", the seconds NOW adds to LAST; empty without LAST
  if [ -n "$2" ]; then echo "$1 $2" | awk '{printf "%+.1f", $1 - $2}'; fi
}

if [ -n "$before" ]; then
  mkdir -p "$work/before"
  git -C "$here" archive "$before" include | tar -x -C "$work/before"
fi
printf '#include <shardwise/compile_kernels.hpp>\n' > "$work/kernels.cpp"
printf '#include <shardwise/mesh/compile_runtime.hpp>\n' > "$work/runtime.cpp"
printf '#include <shardwise/compile_checkpoint.hpp>\n' > "$work/checkpoint.cpp"

echo "$cxx $("$cxx" -dumpfullversion), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), fastest of $repeat"
echo
if [ -n "$parts" ]; then
  echo "| bench/compile_parts.cpp (-O2, the three libraries), up to | seconds | added |"
  echo "|---|---:|---:|"
  names=("parsing the headers" "sw::launch" "make_mesh and submesh" "the model's constructor" "sw::parallelize"
    "forward" "the loss and backward" "AdamW's step, finish_gradients, zero_grad" "sw::load_pretrained"
    "save_sharded and load_sharded")
  last=""
  for n in 0 1 2 3 4 5 6 7 8 9; do
    t=$(fastest "$here/include" "$here/bench/compile_parts.cpp" $libraries -DSHARDWISE_PARTS=$n)
    echo "| $n: ${names[$n]} | $t | $(added "$t" "$last") |"
    last=$t
  done
  exit 0
fi
if [ -n "$pch" ]; then
  echo "| file (-O2, the three libraries) | without | with a precompiled header | the header's own build |"
  echo "|---|---:|---:|---:|"
  for source in $files; do
    grep '^#include <shardwise/' "$here/$source" > "$work/pch.hpp"
    start=$(date +%s.%N)
    "$cxx" $common -I"$here/include" $libraries -x c++-header "$work/pch.hpp" -o "$work/pch.hpp.gch"
    built=$(echo "$start $(date +%s.%N)" | awk '{printf "%.1f", $2 - $1}')
    without=$(fastest "$here/include" "$here/$source" $libraries)
    with=$(fastest "$here/include" "$here/$source" $libraries -include "$work/pch.hpp" -Winvalid-pch)
    echo "| \`$source\` | $without | $with | $built |"
    rm -f "$work/pch.hpp.gch"
  done
  exit 0
fi
if [ -n "$alternate" ]; then
  [ -n "$before" ] || { echo "compile_time.sh: --alternate needs --before REV" >&2; exit 2; }
  echo "| file (-O2, the three libraries) | before ($before), each run | after (this tree), each run |"
  echo "|---|---|---|"
  for source in $files; do
    old="" new=""
    for _ in $(seq "$repeat"); do
      old="$old${old:+, }$(repeat=1 fastest "$work/before/include" "$here/$source" $libraries)"
      new="$new${new:+, }$(repeat=1 fastest "$here/include" "$here/$source" $libraries)"
    done
    echo "| \`$source\` | $old | $new |"
  done
  exit 0
fi
if [ -n "$per_plan" ]; then
  echo "| plans in bench/eight_variants.cpp (float, -O2, the three libraries) | before | added | after | added |"
  echo "|---|---:|---:|---:|---:|"
  last_old="" last_new=""
  for n in 1 2 3 4; do
    old="—" added_old=""
    if [ -n "$before" ]; then
      old=$(fastest "$work/before/include" "$here/bench/eight_variants.cpp" $libraries -DSHARDWISE_BENCH_PLANS=$n)
      added_old=$(added "$old" "$last_old")
      last_old=$old
    fi
    new=$(fastest "$here/include" "$here/bench/eight_variants.cpp" $libraries -DSHARDWISE_BENCH_PLANS=$n)
    added_new=$(added "$new" "$last_new")
    last_new=$new
    echo "| $n | $old | $added_old | $new | $added_new |"
  done
  exit 0
fi
echo "| file | flags | before | all in the file | kernels from separate_kernels | and runtime from" \
  "separate_runtime | and checkpoint IO from separate_checkpoint |"
echo "|---|---|---:|---:|---:|---:|---:|"
for source in $files; do
  for opt in -O2 -O3; do
    old="—"
    [ -n "$before" ] && old=$(fastest "$work/before/include" "$here/$source" "$opt")
    inline=$(fastest "$here/include" "$here/$source" "$opt")
    separate=$(fastest "$here/include" "$here/$source" "$opt" -DSHARDWISE_SEPARATE_KERNELS)
    runtime=$(fastest "$here/include" "$here/$source" "$opt" -DSHARDWISE_SEPARATE_KERNELS -DSHARDWISE_SEPARATE_RUNTIME)
    checkpoint=$(fastest "$here/include" "$here/$source" "$opt" -DSHARDWISE_SEPARATE_KERNELS -DSHARDWISE_SEPARATE_RUNTIME \
      -DSHARDWISE_SEPARATE_CHECKPOINT)
    echo "| \`$source\` | $opt | $old | $inline | $separate | $runtime | $checkpoint |"
  done
done
for opt in -O2 -O3; do
  kernels=$(fastest "$here/include" "$work/kernels.cpp" "$opt")
  runtime=$(fastest "$here/include" "$work/runtime.cpp" "$opt")
  checkpoint=$(fastest "$here/include" "$work/checkpoint.cpp" "$opt")
  echo "| shardwise::separate_kernels' file (once per build) | $opt | | | $kernels | | |"
  echo "| shardwise::separate_runtime's file (once per build) | $opt | | | | $runtime | |"
  echo "| shardwise::separate_checkpoint's file (once per build) | $opt | | | | | $checkpoint |"
done

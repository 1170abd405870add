#!/usr/bin/env bash
# Installs what is missing, builds everything and runs every test. With g++ in a release build: the examples, the
# benchmarks' smoke runs, the tools, every header alone, the compile-fail tests, the package consumers, MPI across
# two hosts, the comparisons with PyTorch and the fuzzers. With clang 14, the thread-mesh tests under
# ThreadSanitizer. With clang 19, the test suite (threads, MPI under mpiexec, faults: built once) and the
# compile-fail tests under AddressSanitizer + UndefinedBehaviorSanitizer. This is what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)

# A compiler cache outside the clone (ccache's own folder, ~/.cache/ccache unless CCACHE_DIR says otherwise): a run
# after a small change recompiles only what the change reaches, in this clone or a fresh one on the same machine
# (paths are taken relative to the clone). The precompiled headers need the two pch/time sloppinesses.
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-10G}
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache  # the builds the tests start (consumers, fuzzers) use it too
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  ccache --zero-stats >/dev/null
fi
cache_stats() {  # what the cache saved this stage
  command -v ccache >/dev/null || return 0
  ccache --print-stats | awk -F'\t' '$1 ~ /^(direct_cache_hit|preprocessed_cache_hit|cache_miss)$/ { n[$1] = $2 }
    END { printf "compiler cache: %d hits, %d misses\n", n["direct_cache_hit"] + n["preprocessed_cache_hit"], n["cache_miss"] }'
  ccache --zero-stats >/dev/null
}

stages=() seconds=() budgets=()
stage() {  # stage BUDGET_MINUTES TITLE...
  local now
  now=$(date +%s)
  ((${#stages[@]})) && seconds[-1]=$((now - stage_started))
  stage_started=$now
  budgets+=("$1")
  shift
  stages+=("$*")
  seconds+=(0)
  echo "== $* ($(date -u +%H:%M:%S) UTC)"
}
stage_table() {
  local total=0 i over
  seconds[-1]=$(($(date +%s) - stage_started))
  echo "== done ($(date -u +%H:%M:%S) UTC); stage minutes (budget):"
  for i in "${!stages[@]}"; do
    over=""
    ((seconds[i] > budgets[i] * 60)) && over="  <- over its budget: see the slowest steps printed at its end"
    awk -v s="${seconds[i]}" -v b="${budgets[i]}" -v t="${stages[i]}" -v o="$over" \
      'BEGIN { printf "%6.1f (%2d)  %s%s\n", s / 60, b, t, o }'
    total=$((total + seconds[i]))
  done
  over=""
  ((total > 2100)) && over="  <- over the 35-minute budget"
  awk -v s="$total" -v o="$over" 'BEGIN { printf "%6.1f (35)  the whole run%s\n", s / 60, o }'
}
# Ninja, whose log gives each target's compile time, unless the folder was configured with another generator.
generator_for() {
  [[ -f $1/CMakeCache.txt ]] && ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$1/CMakeCache.txt" && return
  echo "-GNinja"
}

stage 1 "formatting (.clang-format, clang-format 19: it parses C++20)"
git ls-files '*.hpp' '*.cpp' | xargs clang-format-19 --dry-run --Werror

stage 1 "API reference from the headers (doxygen, warnings as errors)"
mkdir -p build && doxygen docs/Doxyfile  # writes build/api/html

stage 3 "outside references (PyTorch from PyPI, in a virtual environment outside the clone)"
python=$(bash scripts/torch-venv.sh)

stage 14 "build and test (Release, g++): examples, benchmarks, tools, headers, compile-fail tests, consumers, PyTorch"
# -O1 for what runs here (examples, tools, the outside-check programs, the benchmarks' smoke runs): -O3 took 1.7x
# as long to compile them and nothing here is timed (a benchmark built to measure keeps its -O3), and the benchmarks
# link the separate libraries, as a user's build does (a third less of their compiling). The test suite
# is built once, in the ASan + UBSan stage below: a second, uninstrumented build of it cost 1300 s of compiling.
CXX=g++ cmake -S . -B build $(generator_for build) "${launcher[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" -DSHARDWISE_BUILD_TESTS=ON -DSHARDWISE_TEST_SUITE=OFF \
  -DSHARDWISE_BUILD_EXAMPLES=ON -DSHARDWISE_BUILD_BENCH=ON -DSHARDWISE_BENCH_FLAGS=-O1 \
  -DSHARDWISE_BENCH_SEPARATE_LIBRARIES=ON -DSHARDWISE_PYTHON="$python" >/dev/null
cmake --build build -j"$jobs"
cache_stats
# Two test slots over the cores, as in the ASan + UBSan stage: the MPI examples and PyTorch comparisons take two
# slots each, and at one slot per core each ran alone while its single-threaded parts left a core idle.
ctest --test-dir build -j$((jobs + 2)) --output-on-failure
bash scripts/ci-times.sh build

# The clang builds need neither the benchmarks and tools (built and run above) nor the header check. No build
# type: the flags are all given. No debug information: a sanitizer's report names each frame's function (and
# UBSan's its file and line, which it keeps without it), and line tables cost a tenth to a fifth of these builds'
# compiling (under ASan + UBSan, each pair side by side: test_dtensor 44.7 s with -gline-tables-only, 34.4 s without;
# test_llama 140.1 and 124.0 s). For a report's lines, add -gline-tables-only to CMAKE_CXX_FLAGS below and rebuild.
# The test files build at -O0 and what they link (the nn kernels, the runtime) at -O1: instrumented test files at
# -O1 took 4x the compiler time, and CI's run of 442bb97 stopped at 90 minutes in the ASan build.
clang_build=("${launcher[@]}" -DCMAKE_BUILD_TYPE= -DSHARDWISE_BUILD_BENCH=OFF -DSHARDWISE_BUILD_TOOLS=OFF
  -DSHARDWISE_BUILD_HEADER_CHECK=OFF -DSHARDWISE_BUILD_EXAMPLES=OFF -DSHARDWISE_TEST_FILE_FLAGS=-O0)

stage 5 "clang 14 (Debian 12's clang): the thread-mesh tests under ThreadSanitizer"
# Only the thread-mesh test binaries (target shardwise_tsan_tests, label tsan): nothing else here runs threads
# of one process against each other, and the compile-fail tests run under g++ and clang 19.
CXX=clang++-14 cmake -S . -B build-clang14 $(generator_for build-clang14) "${clang_build[@]}" \
  -DCMAKE_CXX_FLAGS="-O1 -fsanitize=thread" \
  -DSHARDWISE_BUILD_COMPILE_CHECKS=OFF -DSHARDWISE_TEST_MPI_CASES=OFF >/dev/null
cmake --build build-clang14 -j"$jobs" --target shardwise_tsan_tests
cache_stats
SHARDWISE_TEST_STEPS=5 TSAN_OPTIONS="halt_on_error=1" ctest --test-dir build-clang14 -j$((jobs + 1)) --output-on-failure -L tsan
bash scripts/ci-times.sh build-clang14

stage 13 "clang 19 (the newest in Debian 12): the test suite and compile-fail tests under ASan + UBSan"
# Every test of the suite, at its full length (50 training steps), on threads and under mpiexec. OpenMPI keeps
# its allocations until exit by design: leak reports would be its, not ours. What the release build above ran
# (consumers, PyTorch, fuzzers, two hosts) is not registered or is left out here by its label.
CXX=clang++-19 cmake -S . -B build-clang19 $(generator_for build-clang19) "${clang_build[@]}" \
  -DSHARDWISE_BUILD_COMPILE_FAIL_TWINS=OFF \
  -DCMAKE_CXX_FLAGS="-O1 -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
  >/dev/null
cmake --build build-clang19 -j"$jobs"
cache_stats
# Two test slots more than cores: some 150 s of its tests is waiting on purpose (for a timeout, a notice, a rank
# held back), an MPI test takes two slots, and the suite passes so beside a busy loop per core (scripts/stress.sh),
# so the waits may overlap: 360 s of tests at 2 slots over the cores against 447 s at one (the same build, quiet).
# Clang 19's runtimes do not find Debian's llvm-symbolizer (llvm-14's) by themselves: told where it is, a report
# names each frame's function instead of giving addresses alone.
ASAN_OPTIONS="detect_leaks=0" UBSAN_OPTIONS="print_stacktrace=1" ASAN_SYMBOLIZER_PATH=/usr/bin/llvm-symbolizer-14 \
  ctest --test-dir build-clang19 -j$((jobs + 2)) --output-on-failure -LE "consumer|torch|fuzz|netns"
bash scripts/ci-times.sh build-clang19
stage_table

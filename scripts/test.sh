#!/usr/bin/env bash
# Installs what is missing, builds everything and runs every test with g++ (threads, MPI under mpiexec, two
# hosts, compile-fail, consumers, examples, comparisons with PyTorch); then with clang 14 the thread-mesh tests
# under ThreadSanitizer, and with clang 19 the suite and compile-fail tests under AddressSanitizer +
# UndefinedBehaviorSanitizer. This is what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)

# Each stage is stamped, and the run ends with a table of every stage's minutes against its budget (the whole run:
# 30 minutes on 2 cores; CI's hard limit is 90), so a CI log shows where its time went and which stage grew.
# scripts/ci-times.sh prints each build's slowest compile steps and tests after its tests.
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
  ((total > 1800)) && over="  <- over the 30-minute budget"
  awk -v s="$total" -v o="$over" 'BEGIN { printf "%6.1f (30)  the whole run%s\n", s / 60, o }'
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

stage 1 "outside references (PyTorch from PyPI, in a virtual environment outside the clone)"
python=$(bash scripts/torch-venv.sh)

stage 15 "build and test (Release, g++)"
# -O1 for what runs in the tests (examples, tools, the outside-check programs, the benchmarks' smoke runs): -O3
# took 1.7x as long to compile them and the tests time nothing (a benchmark built to measure keeps its -O3).
CXX=g++ cmake -S . -B build $(generator_for build) -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
  -DSHARDWISE_BUILD_TESTS=ON -DSHARDWISE_BUILD_EXAMPLES=ON -DSHARDWISE_BUILD_BENCH=ON -DSHARDWISE_BENCH_FLAGS=-O1 \
  -DSHARDWISE_PYTHON="$python" >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build -j"$jobs" --output-on-failure
bash scripts/ci-times.sh build

# The clang builds need neither the benchmarks and tools (built and run above) nor the header check. No build
# type: the flags are all given (line tables are enough for sanitizer reports and cost less to build than -g).
# The test files build at -O0 and what they link (the nn kernels, the runtime) at -O1: instrumented test files at
# -O1 took 4x the compiler time, and CI's run of 442bb97 stopped at 90 minutes in the ASan build.
clang_build=(-DCMAKE_BUILD_TYPE= -DSHARDWISE_BUILD_BENCH=OFF -DSHARDWISE_BUILD_TOOLS=OFF -DSHARDWISE_BUILD_HEADER_CHECK=OFF
  -DSHARDWISE_TEST_FILE_FLAGS=-O0)

stage 4 "clang 14 (Debian 12's clang): the thread-mesh tests under ThreadSanitizer"
# Only the thread-mesh test binaries (target shardwise_tsan_tests, label tsan): nothing else here runs threads
# of one process against each other, and the compile-fail tests run under g++ and clang 19.
CXX=clang++-14 cmake -S . -B build-clang14 $(generator_for build-clang14) "${clang_build[@]}" \
  -DCMAKE_CXX_FLAGS="-O1 -fsanitize=thread -gline-tables-only" \
  -DSHARDWISE_BUILD_EXAMPLES=OFF -DSHARDWISE_BUILD_COMPILE_CHECKS=OFF -DSHARDWISE_TEST_MPI_CASES=OFF >/dev/null
cmake --build build-clang14 -j"$jobs" --target shardwise_tsan_tests
SHARDWISE_TEST_STEPS=5 TSAN_OPTIONS="halt_on_error=1" ctest --test-dir build-clang14 -j"$jobs" --output-on-failure -L tsan
bash scripts/ci-times.sh build-clang14

stage 11 "clang 19 (the newest in Debian 12): the suite and compile-fail tests under ASan + UBSan"
# OpenMPI keeps its allocations until exit by design: leak reports would be its, not ours. The PyTorch
# comparisons ran in the Release build above; here they would only re-run Python. The examples ran above too; the
# library code they call runs here in the tests (Llama with TP/SP/dp, the pipeline, FSDP, async checkpoints,
# sw::launch under MPI), and building them under ASan took 235 s of compiler time: 2 minutes of the run.
CXX=clang++-19 cmake -S . -B build-clang19 $(generator_for build-clang19) "${clang_build[@]}" -DSHARDWISE_BUILD_EXAMPLES=OFF \
  -DSHARDWISE_BUILD_COMPILE_FAIL_TWINS=OFF \
  -DCMAKE_CXX_FLAGS="-O1 -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -gline-tables-only" \
  >/dev/null
cmake --build build-clang19 -j"$jobs"
SHARDWISE_TEST_STEPS=5 ASAN_OPTIONS="detect_leaks=0" UBSAN_OPTIONS="print_stacktrace=1" \
  ctest --test-dir build-clang19 -j"$jobs" --output-on-failure -LE "consumer|torch|fuzz|netns" \
  -E "^test_mpi_pipeline[.]mpi4$"  # 4 processes on 2 cores under ASan: 200 s; pp 4 runs above, and pp 2 here
bash scripts/ci-times.sh build-clang19
stage_table

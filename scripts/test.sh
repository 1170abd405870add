#!/usr/bin/env bash
# Installs what is missing, builds everything and runs every test with g++ (threads, MPI under mpiexec, two
# hosts, compile-fail, consumers, examples, comparisons with PyTorch); then with clang 14 the thread-mesh tests
# under ThreadSanitizer, and with clang 19 the suite, examples and compile-fail tests under AddressSanitizer +
# UndefinedBehaviorSanitizer. This is what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)
stage() { echo "== $* ($(date -u +%H:%M:%S) UTC)"; }  # stamped: a CI log then shows where its time went

stage "formatting (.clang-format, clang-format 19: it parses C++20)"
git ls-files '*.hpp' '*.cpp' | xargs clang-format-19 --dry-run --Werror

stage "API reference from the headers (doxygen, warnings as errors)"
mkdir -p build && doxygen docs/Doxyfile  # writes build/api/html

stage "outside references (PyTorch from PyPI, in a virtual environment outside the clone)"
python=$(bash scripts/torch-venv.sh)

stage "build and test (Release, g++)"
# -O1 for what runs in the tests (examples, tools, the outside-check programs): -O3 took 1.7x as long to
# compile them and the tests do not time them; the benchmarks keep their own -O3 (bench/CMakeLists.txt).
CXX=g++ cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
  -DSHARDWISE_BUILD_TESTS=ON -DSHARDWISE_BUILD_EXAMPLES=ON -DSHARDWISE_BUILD_BENCH=ON -DSHARDWISE_PYTHON="$python" >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build -j"$jobs" --output-on-failure

# The clang builds need neither the benchmarks and tools (built and run above) nor the header check. No build
# type: the flags are all given (line tables are enough for sanitizer reports and cost less to build than -g).
clang_build=(-DCMAKE_BUILD_TYPE= -DSHARDWISE_BUILD_BENCH=OFF -DSHARDWISE_BUILD_TOOLS=OFF -DSHARDWISE_BUILD_HEADER_CHECK=OFF)

stage "clang 14 (Debian 12's clang): the thread-mesh tests under ThreadSanitizer"
# Only the thread-mesh test binaries (target shardwise_tsan_tests, label tsan): nothing else here runs threads
# of one process against each other, and the compile-fail tests run under g++ and clang 19.
CXX=clang++-14 cmake -S . -B build-clang14 "${clang_build[@]}" -DCMAKE_CXX_FLAGS="-fsanitize=thread -gline-tables-only" \
  -DSHARDWISE_BUILD_EXAMPLES=OFF -DSHARDWISE_BUILD_COMPILE_CHECKS=OFF >/dev/null
cmake --build build-clang14 -j"$jobs" --target shardwise_tsan_tests
SHARDWISE_TEST_STEPS=5 TSAN_OPTIONS="halt_on_error=1" ctest --test-dir build-clang14 -j"$jobs" --output-on-failure -L tsan

stage "clang 19 (the newest in Debian 12): the suite, examples and compile-fail tests under ASan + UBSan"
# OpenMPI keeps its allocations until exit by design: leak reports would be its, not ours. The PyTorch
# comparisons ran in the Release build above; here they would only re-run Python.
CXX=clang++-19 cmake -S . -B build-clang19 "${clang_build[@]}" -DSHARDWISE_BUILD_EXAMPLES=ON \
  -DSHARDWISE_BUILD_COMPILE_FAIL_TWINS=OFF \
  -DCMAKE_CXX_FLAGS="-O1 -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -gline-tables-only" \
  >/dev/null  # -O1 for the examples, which run whole trainings; the tests build at -O0 (tests/CMakeLists.txt)
cmake --build build-clang19 -j"$jobs"
SHARDWISE_TEST_STEPS=5 ASAN_OPTIONS="detect_leaks=0" UBSAN_OPTIONS="print_stacktrace=1" \
  ctest --test-dir build-clang19 -j"$jobs" --output-on-failure -LE "consumer|torch|fuzz|netns" \
  -E "^test_mpi_pipeline[.]mpi4$"  # 4 processes on 2 cores under ASan: 200 s; pp 4 runs above, and pp 2 here
stage "done"

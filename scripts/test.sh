#!/usr/bin/env bash
# Installs what is missing, builds everything and runs every test: the suite (threads, MPI under mpiexec,
# compile-fail, consumers, examples), then the thread-mesh tests under ThreadSanitizer and the suite under
# AddressSanitizer + UndefinedBehaviorSanitizer. This is what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)

echo "== formatting (.clang-format, clang-format 19: it parses C++20)"
git ls-files '*.hpp' '*.cpp' | xargs clang-format-19 --dry-run --Werror

echo "== API reference from the headers (doxygen, warnings as errors)"
mkdir -p build && doxygen docs/Doxyfile  # writes build/api/html

echo "== outside references (PyTorch from PyPI, in a virtual environment outside the clone)"
python=$(bash scripts/torch-venv.sh)

echo "== build and test (Release)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSHARDWISE_BUILD_TESTS=ON -DSHARDWISE_BUILD_EXAMPLES=ON \
  -DSHARDWISE_BUILD_BENCH=ON -DSHARDWISE_PYTHON="$python" >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build -j"$jobs" --output-on-failure

thread_tests="test_faults|test_bad_sizes|test_collectives|test_collectives_xtensor|test_dtensor|test_thread|test_mesh|test_adapters|test_nn|test_llama|test_lazy|test_checkpoint_sharded|test_safetensors"

echo "== thread-mesh tests under ThreadSanitizer"
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS="-fsanitize=thread -g" \
  -DSHARDWISE_BUILD_EXAMPLES=OFF -DSHARDWISE_BUILD_BENCH=OFF -DSHARDWISE_BUILD_TOOLS=OFF \
  -DSHARDWISE_BUILD_COMPILE_CHECKS=OFF >/dev/null
cmake --build build-tsan -j"$jobs" --target ${thread_tests//|/ }
SHARDWISE_TEST_STEPS=5 TSAN_OPTIONS="halt_on_error=1" ctest --test-dir build-tsan -j"$jobs" --output-on-failure -R "^(${thread_tests})$"

echo "== suite under AddressSanitizer + UndefinedBehaviorSanitizer"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g" \
  -DSHARDWISE_BUILD_EXAMPLES=OFF -DSHARDWISE_BUILD_BENCH=OFF -DSHARDWISE_BUILD_TOOLS=OFF \
  -DSHARDWISE_BUILD_COMPILE_CHECKS=OFF >/dev/null  # examples, tools and compile checks ran in the Release build
cmake --build build-asan -j"$jobs"
# OpenMPI keeps its allocations until exit by design: leak reports would be its, not ours. The PyTorch
# comparisons ran in the Release build above; here they would only re-run Python.
SHARDWISE_TEST_STEPS=5 ASAN_OPTIONS="detect_leaks=0" UBSAN_OPTIONS="print_stacktrace=1" \
  ctest --test-dir build-asan -j"$jobs" --output-on-failure -LE "compile_fail|consumer|torch|fuzz"

#pragma once
// Compiles the parts of sw::launch's RuntimeComm that reach both backends' algorithms — split, barrier, and the
// collectives for float and double — once. Include it in exactly one .cpp file of a program whose other files
// define SHARDWISE_SEPARATE_RUNTIME: they then call these instead of compiling their own copies of the thread and
// MPI algorithms (docs/build-time.md). CMake's shardwise::separate_runtime target does both.
#if defined(SHARDWISE_DETAIL_RUNTIME_COLLECTIVES)
#error "shardwise: include <shardwise/mesh/compile_runtime.hpp> before runtime.hpp and launch.hpp"
#endif
#define SHARDWISE_DETAIL_COMPILING_RUNTIME
#include "shardwise/mesh/runtime.hpp"

namespace shardwise::detail {
SHARDWISE_DETAIL_RUNTIME_SPLIT_AND_BARRIER()
SHARDWISE_DETAIL_RUNTIME_COLLECTIVES(, float)
SHARDWISE_DETAIL_RUNTIME_COLLECTIVES(, double)
SHARDWISE_DETAIL_RUNTIME_BITS_GATHER()
}  // namespace shardwise::detail

#pragma once
// Compiles sw::launch's RuntimeComm's MPI side (for every element type MPI transfers), both backends'
// collectives for float and double, and the thread mesh's own code (mesh/compiled_once.hpp) once. Include it in exactly
// one .cpp file of a program whose other files define SHARDWISE_SEPARATE_RUNTIME: they then call these instead of
// compiling their own copies of the thread and MPI algorithms (docs/build-time.md). CMake's shardwise::separate_runtime
// target does both.
#if defined(SHARDWISE_DETAIL_RUNTIME_COLLECTIVES) || \
    (defined(SHARDWISE_DETAIL_RUNTIME_BODIES) && !defined(SHARDWISE_DETAIL_COMPILING_RUNTIME))
#error "shardwise: include <shardwise/mesh/compile_runtime.hpp> before runtime.hpp and launch.hpp"
#endif
#define SHARDWISE_DETAIL_COMPILING_RUNTIME
#include "shardwise/mesh/mpi/runtime.hpp"
#include "shardwise/mesh/runtime.hpp"

namespace shardwise::detail {
template struct runtime_mpi<MpiComm>;
SHARDWISE_DETAIL_RUNTIME_MPI_COLLECTIVES(float)
SHARDWISE_DETAIL_RUNTIME_MPI_COLLECTIVES(double)
SHARDWISE_DETAIL_RUNTIME_MPI_COLLECTIVES(std::int8_t)
SHARDWISE_DETAIL_RUNTIME_MPI_COLLECTIVES(std::uint8_t)
SHARDWISE_DETAIL_RUNTIME_MPI_COLLECTIVES(std::int16_t)
SHARDWISE_DETAIL_RUNTIME_MPI_COLLECTIVES(std::uint16_t)
SHARDWISE_DETAIL_RUNTIME_MPI_COLLECTIVES(std::int32_t)
SHARDWISE_DETAIL_RUNTIME_MPI_COLLECTIVES(std::uint32_t)
SHARDWISE_DETAIL_RUNTIME_MPI_COLLECTIVES(std::int64_t)
SHARDWISE_DETAIL_RUNTIME_MPI_COLLECTIVES(std::uint64_t)
#if __has_include(<Eigen/Core>)  // 16-bit floating types, moved as bits (FSDP's mixed precision)
}  // namespace shardwise::detail
#include <Eigen/Core>
namespace shardwise::detail {
SHARDWISE_DETAIL_RUNTIME_MPI_COLLECTIVES(Eigen::bfloat16)
SHARDWISE_DETAIL_RUNTIME_MPI_COLLECTIVES(Eigen::half)
#endif
SHARDWISE_DETAIL_RUNTIME_COLLECTIVES(, float)
SHARDWISE_DETAIL_RUNTIME_COLLECTIVES(, double)
SHARDWISE_DETAIL_RUNTIME_BITS_GATHER()
SHARDWISE_DETAIL_RUNTIME_COUNT_SUMS()
}  // namespace shardwise::detail

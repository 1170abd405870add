#pragma once
// Where the thread mesh's own code is compiled. By default every file that runs ranks as threads compiles it,
// inline. With SHARDWISE_SEPARATE_RUNTIME (CMake: link shardwise::separate_runtime) its functions that do not
// depend on the program's types — the barrier and its long waits, the desync check and its messages, splitting a
// group, running the rank threads and reporting their failures — are compiled once, in the one file that
// includes <shardwise/mesh/compile_runtime.hpp>; the other files see their declarations only
// (docs/build-time.md).
//
// SHARDWISE_DETAIL_RUNTIME_ENTRY precedes such a function's declaration and its definition; the definition stands
// inside `#if SHARDWISE_DETAIL_RUNTIME_BODIES`.
#if defined(SHARDWISE_SEPARATE_RUNTIME) || defined(SHARDWISE_DETAIL_COMPILING_RUNTIME)
#define SHARDWISE_DETAIL_RUNTIME_ENTRY  // one definition, in the library
#else
#define SHARDWISE_DETAIL_RUNTIME_ENTRY inline
#endif
#if defined(SHARDWISE_SEPARATE_RUNTIME) && !defined(SHARDWISE_DETAIL_COMPILING_RUNTIME)
#define SHARDWISE_DETAIL_RUNTIME_BODIES 0
#else
#define SHARDWISE_DETAIL_RUNTIME_BODIES 1
#endif

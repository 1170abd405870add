#pragma once
// Compiles the library's kernels once for float and double: the nn kernels and the cores of the library's layers and
// AdamW (nn/kernels/compile_kernels.hpp), and the models' rotary embedding (models/rotary_embedding.hpp). Include it
// in exactly one .cpp file of a program whose other files define SHARDWISE_SEPARATE_KERNELS: they then call these
// instead of compiling their own copies, which is most of a model file's build time (docs/build-time.md). CMake's
// shardwise::separate_kernels target does both.
#define SHARDWISE_DETAIL_COMPILING_ALL_KERNELS
#include "shardwise/nn/kernels/compile_kernels.hpp"
// (first: it refuses a file that included another shardwise header before it)
#include "shardwise/models/rotary_embedding.hpp"

namespace shardwise::models {
SHARDWISE_DETAIL_ROTARY_KERNELS(, float)
SHARDWISE_DETAIL_ROTARY_KERNELS(, double)
}  // namespace shardwise::models

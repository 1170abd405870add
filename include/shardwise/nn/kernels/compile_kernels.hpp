#pragma once
// The nn part of <shardwise/compile_kernels.hpp>, which a program includes: the nn kernels (functional.hpp,
// functional_elementwise.hpp, functional_attention.hpp) and the cores of the library's Linear, Embedding and norm
// styles (linear.hpp, embedding.hpp, norm.hpp) and AdamW (optim.hpp) for float and double.
#if defined(SHARDWISE_DETAIL_FUNCTIONAL_KERNELS)
#error "shardwise: include <shardwise/compile_kernels.hpp> before any other shardwise header of its file"
#endif
#if !defined(SHARDWISE_DETAIL_COMPILING_ALL_KERNELS)
#error "shardwise: include <shardwise/compile_kernels.hpp>, which compiles the models' kernels too, not this nn part"
#endif
#define SHARDWISE_DETAIL_COMPILING_KERNELS
#include "shardwise/nn/kernels/functional.hpp"
#include "shardwise/nn/kernels/functional_attention.hpp"
#include "shardwise/nn/layers/embedding.hpp"
#include "shardwise/nn/layers/linear.hpp"
#include "shardwise/nn/layers/norm.hpp"
#include "shardwise/nn/training/optim.hpp"

namespace shardwise::detail {
template <>
bool const separate_kernels_compiled_with<EIGEN_MAX_ALIGN_BYTES, eigen_uses_blas>::same_eigen_flags_as_this_file = true;
}  // namespace shardwise::detail

namespace shardwise::nn {
SHARDWISE_DETAIL_FUNCTIONAL_KERNELS(, float)
SHARDWISE_DETAIL_FUNCTIONAL_KERNELS(, double)
SHARDWISE_DETAIL_ELEMENTWISE_KERNELS(, float)
SHARDWISE_DETAIL_ELEMENTWISE_KERNELS(, double)
SHARDWISE_DETAIL_ATTENTION_KERNELS(, float)
SHARDWISE_DETAIL_ATTENTION_KERNELS(, double)
}  // namespace shardwise::nn

namespace shardwise::detail {
SHARDWISE_DETAIL_LINEAR_CORES(, float)
SHARDWISE_DETAIL_LINEAR_CORES(, double)
SHARDWISE_DETAIL_NORM_CORES(, float)
SHARDWISE_DETAIL_NORM_CORES(, double)
SHARDWISE_DETAIL_EMBEDDING_CORES(, float)
SHARDWISE_DETAIL_EMBEDDING_CORES(, double)
}  // namespace shardwise::detail

namespace shardwise {
SHARDWISE_DETAIL_OPTIMIZER(, float)
SHARDWISE_DETAIL_OPTIMIZER(, double)
}  // namespace shardwise

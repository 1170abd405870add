#pragma once
// A Linear's forward and backward GEMMs alone, as the benchmarks time the machine without the library around them.
#include <shardwise/nn/kernels/bf16_gemm.hpp>
#include <shardwise/nn/kernels/functional_types.hpp>

namespace bench {

/// y = x w^T, dx = dy w, dw = dy^T x: 6 x tokens x in x out FLOPs, for x [tokens, in] and w [out, in].
template <class T>
void linear_gemms(shardwise::nn::matrix<T> const& x, shardwise::nn::matrix<T> const& w,
                  shardwise::nn::matrix<T> const& dy, shardwise::nn::matrix<T>& y, shardwise::nn::matrix<T>& dx,
                  shardwise::nn::matrix<T>& dw) {
  y.noalias() = x * w.transpose();
  dx.noalias() = dy * w;
  dw.noalias() = dy.transpose() * x;
}

/// The same three products as sw::bf16_autocast runs them (shardwise's bf16 GEMM: oneDNN where the build links it),
/// on operands already rounded to bf16, so that the rounding, which is the library's work, is not among them.
struct bf16_linear_operands {
  shardwise::detail::bf16_rows x, w, dy;
};
inline void linear_gemms_bf16(bf16_linear_operands const& o, shardwise::nn::matrix<float>& y,
                              shardwise::nn::matrix<float>& dx, shardwise::nn::matrix<float>& dw) {
  using shardwise::detail::bf16_gemm;
  bf16_gemm(o.x.view(), o.w.view().transposed(), y.data(), y.cols(), false);
  bf16_gemm(o.dy.view(), o.w.view(), dx.data(), dx.cols(), false);
  bf16_gemm(o.dy.view().transposed(), o.x.view(), dw.data(), dw.cols(), true);
}

}  // namespace bench

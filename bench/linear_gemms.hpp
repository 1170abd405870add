#pragma once
// A Linear's forward and backward GEMMs alone, as the benchmarks time the machine without the library around them.
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

}  // namespace bench

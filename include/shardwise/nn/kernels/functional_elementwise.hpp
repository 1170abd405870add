#pragma once
// Element-wise activation functions, forward (x -> y) and backward (x, dy -> dx), as torch.nn.functional has them.
// Each is one coefficient-wise Eigen expression, so y may be the same memory as x, and dx the same as dy.
// Conventions (T not deduced, shapes checked, Ref views) are those of shardwise/nn/kernels/functional.hpp.
#include <numbers>
#include <unsupported/Eigen/SpecialFunctions>  // erf on arrays

#include "shardwise/nn/kernels/functional_types.hpp"

namespace shardwise::detail {
template <class T>
void nn_check_unary(char const* fn, nn::const_matrix_ref<T> const& x, nn::matrix_ref<T> const& y) {
  nn_check_shape(fn, "y", y, x.rows(), x.cols());
}
template <class T>
void nn_check_unary_backward(char const* fn, nn::const_matrix_ref<T> const& x, nn::const_matrix_ref<T> const& dy,
                             nn::matrix_ref<T> const& dx) {
  nn_check_shape(fn, "dy", dy, x.rows(), x.cols());
  nn_check_shape(fn, "dx", dx, x.rows(), x.cols());
}
}  // namespace shardwise::detail

namespace shardwise::nn {

/// y = max(x, 0).
template <std::floating_point T>
void relu_forward(const_matrix_ref<T> x, matrix_ref<T> y) {
  detail::nn_check_unary<T>("relu_forward", x, y);
  y = x.cwiseMax(T(0));
}
/// dx = dy where x > 0, else 0 (the derivative at 0 is taken as 0, as torch does).
template <std::floating_point T>
void relu_backward(const_matrix_ref<T> x, const_matrix_ref<T> dy, matrix_ref<T> dx) {
  detail::nn_check_unary_backward<T>("relu_backward", x, dy, dx);
  dx.array() = (x.array() > T(0)).select(dy.array(), T(0));
}

/// y = x * sigmoid(x): torch.nn.SiLU, the Swish of Llama's MLP.
template <std::floating_point T>
void silu_forward(const_matrix_ref<T> x, matrix_ref<T> y) {
  detail::nn_check_unary<T>("silu_forward", x, y);
  y.array() = x.array() * x.array().logistic();
}
/// dx = dy * s (1 + x (1 - s)) with s = sigmoid(x).
template <std::floating_point T>
void silu_backward(const_matrix_ref<T> x, const_matrix_ref<T> dy, matrix_ref<T> dx) {
  detail::nn_check_unary_backward<T>("silu_backward", x, dy, dx);
  auto const s = x.array().logistic();
  dx.array() = dy.array() * s * (T(1) + x.array() * (T(1) - s));
}

/// y = x/2 (1 + erf(x / sqrt 2)): the exact GELU, torch's default (approximate='none').
template <std::floating_point T>
void gelu_forward(const_matrix_ref<T> x, matrix_ref<T> y) {
  detail::nn_check_unary<T>("gelu_forward", x, y);
  constexpr T inv_sqrt2 = std::numbers::sqrt2_v<T> / 2;
  y.array() = T(0.5) * x.array() * (T(1) + (x.array() * inv_sqrt2).erf());
}
/// dx = dy (Phi(x) + x phi(x)), with Phi and phi the standard normal CDF and density.
template <std::floating_point T>
void gelu_backward(const_matrix_ref<T> x, const_matrix_ref<T> dy, matrix_ref<T> dx) {
  detail::nn_check_unary_backward<T>("gelu_backward", x, dy, dx);
  constexpr T inv_sqrt2 = std::numbers::sqrt2_v<T> / 2;
  constexpr T inv_sqrt_2pi = std::numbers::inv_sqrtpi_v<T> * inv_sqrt2;
  auto const xa = x.array();
  dx.array() =
      dy.array() * (T(0.5) * (T(1) + (xa * inv_sqrt2).erf()) + xa * inv_sqrt_2pi * (T(-0.5) * xa.square()).exp());
}

/// y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): torch's approximate='tanh' (GPT-2's "gelu_new").
template <std::floating_point T>
void gelu_tanh_forward(const_matrix_ref<T> x, matrix_ref<T> y) {
  detail::nn_check_unary<T>("gelu_tanh_forward", x, y);
  constexpr T k = std::numbers::sqrt2_v<T> * std::numbers::inv_sqrtpi_v<T>, c = T(0.044715);
  auto const xa = x.array();
  y.array() = T(0.5) * xa * (T(1) + (k * (xa + c * xa.cube())).tanh());
}
/// dx = dy (1/2 (1 + t) + x/2 (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)), t the tanh of the forward.
template <std::floating_point T>
void gelu_tanh_backward(const_matrix_ref<T> x, const_matrix_ref<T> dy, matrix_ref<T> dx) {
  detail::nn_check_unary_backward<T>("gelu_tanh_backward", x, dy, dx);
  constexpr T k = std::numbers::sqrt2_v<T> * std::numbers::inv_sqrtpi_v<T>, c = T(0.044715);
  auto const xa = x.array();
  auto const t = (k * (xa + c * xa.cube())).tanh();
  dx.array() =
      dy.array() * (T(0.5) * (T(1) + t) + T(0.5) * xa * (T(1) - t.square()) * k * (T(1) + T(3) * c * xa.square()));
}

}  // namespace shardwise::nn

// With SHARDWISE_SEPARATE_KERNELS defined, the activations for float and double are declared here and compiled once,
// by the one file that includes <shardwise/compile_kernels.hpp> (CMake: link shardwise::separate_kernels),
// instead of in every file that calls them (docs/build-time.md).
#define SHARDWISE_DETAIL_ELEMENTWISE_KERNELS(prefix, T)                                           \
  prefix template void relu_forward<T>(const_matrix_ref<T>, matrix_ref<T>);                       \
  prefix template void silu_forward<T>(const_matrix_ref<T>, matrix_ref<T>);                       \
  prefix template void gelu_forward<T>(const_matrix_ref<T>, matrix_ref<T>);                       \
  prefix template void gelu_tanh_forward<T>(const_matrix_ref<T>, matrix_ref<T>);                  \
  prefix template void relu_backward<T>(const_matrix_ref<T>, const_matrix_ref<T>, matrix_ref<T>); \
  prefix template void silu_backward<T>(const_matrix_ref<T>, const_matrix_ref<T>, matrix_ref<T>); \
  prefix template void gelu_backward<T>(const_matrix_ref<T>, const_matrix_ref<T>, matrix_ref<T>); \
  prefix template void gelu_tanh_backward<T>(const_matrix_ref<T>, const_matrix_ref<T>, matrix_ref<T>);
#if defined(SHARDWISE_SEPARATE_KERNELS)
namespace shardwise::nn {
SHARDWISE_DETAIL_ELEMENTWISE_KERNELS(extern, float)
SHARDWISE_DETAIL_ELEMENTWISE_KERNELS(extern, double)
}  // namespace shardwise::nn
#endif

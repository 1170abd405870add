#pragma once
// Element-wise functions on activations: the layout passes through unchanged, except that a Partial
// activation is refused, since silu(a) + silu(b) is not silu(a + b). Given a temporary, each writes its result
// into the temporary's storage.
#include <utility>

#include "shardwise/nn/activation.hpp"
#include "shardwise/nn/kernels/functional_elementwise.hpp"

namespace shardwise {

namespace detail {
template <class P>
constexpr bool nonlinear_input_ok() {
  static_assert(
      !is_partial_v<P>,
      "shardwise::relu/silu/gelu/gelu_tanh: a non-linear function of a Partial activation is not the function of "
      "the sum; reduce it first (RowwiseParallel's output_layouts)");
  return !is_partial_v<P>;
}
}  // namespace detail

#define SHARDWISE_ELEMENTWISE(name)                                                                                  \
  template <class T, class P>                                                                                        \
  Activation<T, P> name(Activation<T, P> const& x) {                                                                 \
    static_assert(detail::nonlinear_input_ok<P>());                                                                  \
    Activation<T, P> y{nn::matrix<T>(x.local.rows(), x.local.cols())};                                               \
    nn::name##_forward<T>(x.local, y.local);                                                                         \
    return y;                                                                                                        \
  }                                                                                                                  \
  /** name of a temporary, written into its storage. */                                                              \
  template <class T, class P>                                                                                        \
  Activation<T, P> name(Activation<T, P>&& x) {                                                                      \
    static_assert(detail::nonlinear_input_ok<P>());                                                                  \
    nn::name##_forward<T>(x.local, x.local);                                                                         \
    return {std::move(x.local)};                                                                                     \
  }                                                                                                                  \
  /** The gradient through name at input x. */                                                                       \
  template <class T, class P, class Q>                                                                               \
  Activation<T, P> name##_backward(Activation<T, P> const& x, Activation<T, Q> const& dy) {                          \
    static_assert(detail::same_layout_v<P, Q>, "shardwise::" #name "_backward: x and dy must have the same layout"); \
    Activation<T, P> dx{nn::matrix<T>(x.local.rows(), x.local.cols())};                                              \
    nn::name##_backward<T>(x.local, dy.local, dx.local);                                                             \
    return dx;                                                                                                       \
  }                                                                                                                  \
  /** The gradient through name at input x, written into the temporary dy's storage. */                              \
  template <class T, class P, class Q>                                                                               \
  Activation<T, P> name##_backward(Activation<T, P> const& x, Activation<T, Q>&& dy) {                               \
    static_assert(detail::same_layout_v<P, Q>, "shardwise::" #name "_backward: x and dy must have the same layout"); \
    nn::name##_backward<T>(x.local, dy.local, dy.local);                                                             \
    return {std::move(dy.local)};                                                                                    \
  }

SHARDWISE_ELEMENTWISE(relu)
SHARDWISE_ELEMENTWISE(silu)
SHARDWISE_ELEMENTWISE(gelu)
SHARDWISE_ELEMENTWISE(gelu_tanh)
#undef SHARDWISE_ELEMENTWISE

}  // namespace shardwise

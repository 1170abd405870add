#pragma once
// Shape-only activations (sw::meta<T>; cost/meta_trace.hpp) and the element-wise functions on them: the same
// shapes and the same storage reuse as the functions on real activations (a temporary's storage becomes the
// result), so that a shape-only run holds what the real run holds, at every point of its backward.
#include <utility>

#include "shardwise/cost/meta_trace.hpp"
#include "shardwise/nn/activation.hpp"
#include "shardwise/nn/elementwise.hpp"

namespace shardwise {

/// A shape-only activation: this rank's [rows, cols] and, in the type, its layout P on the tp axis.
template <class T, class P>
struct Activation<meta<T>, P> {
  using element_type = meta<T>;  ///< The element type.
  using placement = P;           ///< The layout on the tp axis.
  meta_matrix<T> local;          ///< This rank's part: its shape.
};

#define SHARDWISE_DETAIL_META_ELEMENTWISE(name)                                                                      \
  template <class T, class P>                                                                                        \
  constexpr Activation<meta<T>, P> name(Activation<meta<T>, P> const& x) {                                           \
    static_assert(detail::nonlinear_input_ok<P>());                                                                  \
    return {x.local.like(x.local.rows(), x.local.cols())};                                                           \
  }                                                                                                                  \
  template <class T, class P>                                                                                        \
  constexpr Activation<meta<T>, P> name(Activation<meta<T>, P>&& x) {                                                \
    static_assert(detail::nonlinear_input_ok<P>());                                                                  \
    return {std::move(x.local)};                                                                                     \
  }                                                                                                                  \
  template <class T, class P, class Q>                                                                               \
  constexpr Activation<meta<T>, P> name##_backward(Activation<meta<T>, P> const& x, Activation<meta<T>, Q> const&) { \
    return {x.local.like(x.local.rows(), x.local.cols())};                                                           \
  }                                                                                                                  \
  template <class T, class P, class Q>                                                                               \
  constexpr Activation<meta<T>, P> name##_backward(Activation<meta<T>, P> const&, Activation<meta<T>, Q>&& dy) {     \
    return {std::move(dy.local)};                                                                                    \
  }

/// @{ relu, silu, gelu and gelu_tanh of a shape-only activation (and their gradients): as on a real one.
SHARDWISE_DETAIL_META_ELEMENTWISE(relu)
SHARDWISE_DETAIL_META_ELEMENTWISE(silu)
SHARDWISE_DETAIL_META_ELEMENTWISE(gelu)
SHARDWISE_DETAIL_META_ELEMENTWISE(gelu_tanh)
/// @}
#undef SHARDWISE_DETAIL_META_ELEMENTWISE

}  // namespace shardwise

#pragma once
// Shape-only activations (sw::meta<T>; cost/meta_trace.hpp) and the element-wise functions on them: the same
// shapes and the same storage reuse as the functions on real activations (a temporary's storage becomes the
// result), so that a shape-only run holds what the real run holds, at every point of its backward.
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "shardwise/cost/meta_trace.hpp"
#include "shardwise/nn/activation.hpp"
#include "shardwise/nn/elementwise.hpp"
#include "shardwise/placement/chunk.hpp"

namespace shardwise {

/// A shape-only activation: this rank's [rows, cols] and, in the type, its layout P on the tp axis.
template <class T, class P>
struct Activation<meta<T>, P> {
  using element_type = meta<T>;  ///< The element type.
  using placement = P;           ///< The layout on the tp axis.
  meta_matrix<T> local;          ///< This rank's part: its shape.
};

/// Token ids on shapes: how many, and the trace the run reports to (what a shape-only model's forward takes).
struct meta_ids {
  std::size_t count = 0;        ///< How many ids.
  meta_trace* trace = nullptr;  ///< The run's trace.
  /// How many ids, as a span's size.
  [[nodiscard]] constexpr std::size_t size() const { return count; }
};

/// The token ids a model of element type T takes: a span of int64 for real numbers, sw::meta_ids on shapes, so
/// that one forward serves both.
template <class T>
struct token_ids {
  using type = std::span<const std::int64_t>;  ///< Real ids.
};
/// On shapes: a count.
template <class T>
struct token_ids<meta<T>> {
  using type = meta_ids;  ///< Shape-only ids.
};
/// token_ids<T>::type.
template <class T>
using token_ids_t = typename token_ids<T>::type;

/// What a shape-only layer has where the real one has a parameter's values: nothing (sw::tie_weights hands it on,
/// and a model's constructor may scale it, as GPT-2's scales its embeddings).
struct meta_values {
  /// Scaled: still nothing.
  template <class Number>
  constexpr meta_values& operator*=(Number) {
    return *this;
  }
};

/// A shape-only activation of a's layout and shape (as sw::empty_like of a real one).
template <class T, class P>
constexpr Activation<meta<T>, P> empty_like(Activation<meta<T>, P> const& a) {
  return {a.local.like(a.local.rows(), a.local.cols())};
}

namespace detail {
/// This rank's rows of an activation of s.tokens rows in Layout (its tokens where Layout cuts them).
template <class Layout>
constexpr std::ptrdiff_t meta_rows(cost_inputs const& s) {
  return static_cast<std::ptrdiff_t>(std::is_same_v<normalize_2d_t<Layout>, Shard<0>> ? s.local_tokens() : s.tokens);
}
/// This rank's columns of an activation of whole_cols columns in Layout over `ranks` (its chunk where Layout
/// cuts them).
template <class Layout>
constexpr std::ptrdiff_t meta_cols(std::size_t whole_cols, std::size_t ranks, std::size_t rank) {
  bool const cut = std::is_same_v<normalize_2d_t<Layout>, Shard<1>>;
  return static_cast<std::ptrdiff_t>(shard_extent(whole_cols, cut, ranks, rank));
}

/// x moved from layout From to layout To by Mover, on shapes: the move's transfers added to `list` (Mover's
/// add_cost, for the whole activation) and the moved activation's shape on this rank.
template <class Mover, class From, class To, class T>
constexpr meta_matrix<T> meta_moved(meta_matrix<T> const& x, transfer_list<>& list) {
  cost_inputs const& s = x.trace()->inputs;
  bool const cut = std::is_same_v<normalize_2d_t<From>, Shard<1>>;
  std::size_t const whole_cols = static_cast<std::size_t>(x.cols()) * (cut ? s.tp : 1);
  Mover::template add_cost<From, To>(list, s.tokens, whole_cols, sizeof(T), s);
  return x.like(meta_rows<To>(s), meta_cols<To>(whole_cols, s.tp, s.tp_rank));
}

}  // namespace detail

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

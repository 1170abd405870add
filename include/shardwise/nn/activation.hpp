#pragma once
// Activations between layers carry their layout on the tensor-parallel axis in their type, so a plan whose
// layouts do not chain (a Colwise output fed to a layer that expects a replicated input, a Rowwise output fed
// to a vocabulary-parallel loss) does not compile. `local` is this rank's part, a plain Eigen matrix.
#include <type_traits>
#include <utility>

#include "shardwise/core/error.hpp"
#include "shardwise/core/show.hpp"
#include "shardwise/nn/group.hpp"
#include "shardwise/placement/placement.hpp"
#include "shardwise/tensor/concept.hpp"

namespace shardwise {

/// An activation between layers: this rank's part and, in the type, its layout P on the tensor-parallel axis.
template <class T, class P = Replicate>
struct Activation {
  static_assert(placement<P>, "shardwise::Activation: the layout must be Replicate, Shard<D> or Partial<Op>");
  using element_type = T;  ///< The element type.
  using placement = P;     ///< The layout on the tp axis: Replicate, Shard<D> or Partial<Op>.
  nn::matrix<T> local;     ///< This rank's part, a plain Eigen matrix.
};

/// An activation of a's layout and shape whose values are not set: for an output a kernel writes in full.
template <class T, class P>
Activation<T, P> empty_like(Activation<T, P> const& a) {
  return {nn::matrix<T>(a.local.rows(), a.local.cols())};
}

namespace detail {

/// Activations are [tokens, features]: Shard<-1> and Shard<1> are the same placement, as are Shard<-2> and 0.
template <class P>
struct normalize_2d {
  using type = P;
};
template <int D>
struct normalize_2d<Shard<D>> {
  using type = Shard<(D < 0 ? D + 2 : D)>;
};
template <class P>
using normalize_2d_t = typename normalize_2d<P>::type;

template <class A, class B>
inline constexpr bool same_layout_v = std::is_same_v<normalize_2d_t<A>, normalize_2d_t<B>>;

/// Incomplete on purpose: the diagnostic shows the layer's path and both layouts.
template <fixed_string Path, class Expected, class Got, class Spelled = spelled_t<Path>>
struct input_layout_mismatch_at;

template <class T>
inline constexpr bool is_activation_v = false;
template <class T, class P>
inline constexpr bool is_activation_v<Activation<T, P>> = true;

/// The layout of what a layer is given: a typed activation says it; a plain matrix is taken to be in the
/// style's declared input layout, as PyTorch annotates plain tensors.
template <class X, class Declared>
struct given_layout {
  using type = Declared;
};
template <class T, class P, class Declared>
struct given_layout<Activation<T, P>, Declared> {
  using type = P;
};

template <class Expected, class X>
inline constexpr bool input_layout_matches =
    same_layout_v<Expected, typename given_layout<std::remove_cvref_t<X>, Expected>::type>;

/// Named in decltype beside a static_assert on input_layout_matches (instantiated, never evaluated: see
/// mesh.hpp's show_if_named_twice): names the layer and both layouts in the diagnostic.
template <fixed_string Path, class Expected, class X>
constexpr auto show_layout_mismatch() {
  if constexpr (!input_layout_matches<Expected, X>) {
    using offending_layouts [[maybe_unused]] =
        decltype(detail::show_incomplete<input_layout_mismatch_at<
                     Path, Expected, typename given_layout<std::remove_cvref_t<X>, Expected>::type>>());
  }
  return true;
}

/// What a layer accepts: a typed Activation, or a plain row-major [tokens, features] tensor of element T (an
/// Eigen row-major matrix, an xt::xtensor<T, 2>, any rank-2 row-major shardwise tensor).
template <class T, class X>
inline constexpr bool layer_input_v = [] {
  if constexpr (is_activation_v<X>)
    return std::is_same_v<typename X::element_type, T>;
  else if constexpr (tensor<X>)
    return std::is_same_v<element_t<X>, T> && rank_v<X> == 2 && traits_of<X>::order == storage_order::row_major;
  else
    return false;
}();

/// The local part of a layer's input: the Activation's matrix, or a view of a plain tensor (no copy).
template <class T, class X>
constexpr decltype(auto) local_of(X const& x) {
  if constexpr (is_activation_v<X>) {
    return (x.local);
  } else if constexpr (std::is_same_v<X, nn::matrix<T>>) {
    return (x);
  } else {
    extents const e = shape_of(x);
    return Eigen::Map<const nn::matrix<T>>(traits_of<X>::data(x), static_cast<Eigen::Index>(e[0]),
                                           static_cast<Eigen::Index>(e[1]));
  }
}

}  // namespace detail

/// The type of a layer's output: an Activation in the layout its style gives. For the activations a module
/// keeps for its backward: `sw::output_t<decltype(w1)> h1_;`.
template <class Layer>
using output_t = Activation<typename Layer::matrix::Scalar, typename Layer::output_layout>;

// Element-wise arithmetic between activations keeps the layout and refuses to mix layouts. Where an operand is a
// temporary, the result is written into its storage: no new matrix, no page faults for one (multiplication and
// addition commute, so the bits are those of the plain product or sum).
namespace detail {
template <class P, class Q>
constexpr void check_product_layouts() {
  static_assert(detail::same_layout_v<P, Q>,
                "shardwise::operator*: the two activations have different layouts; "
                "redistribute one of them first");
  static_assert(!is_partial_v<P>,
                "shardwise::operator*: a product of partial sums is not the product of the sums; "
                "reduce the activations first (RowwiseParallel's output_layouts)");
}
template <class P, class Q>
constexpr void check_sum_layouts() {
  static_assert(detail::same_layout_v<P, Q>,
                "shardwise::operator+: the two activations have different layouts; "
                "redistribute one of them first");
}
/// Element-wise operands must have the same shape on this rank (Eigen checks only in debug builds).
template <class Matrix>
constexpr void check_same_shape(char const* op, Matrix const& a, Matrix const& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols())
    detail::fail("shardwise::operator", op, ": activations of ", a.rows(), "x", a.cols(), " and ", b.rows(), "x",
                 b.cols(),
                 " on this rank; element-wise arithmetic needs the same shape: give both the same tokens and "
                 "features (check that both come from the same batch and that the layers' output widths match)");
}
}  // namespace detail

/// The element-wise product, in a's layout.
template <class T, class P, class Q>
constexpr Activation<T, P> operator*(Activation<T, P> const& a, Activation<T, Q> const& b) {
  detail::check_product_layouts<P, Q>();
  detail::check_same_shape("*", a.local, b.local);
  return {a.local.cwiseProduct(b.local)};
}
/// The element-wise product, written into the temporary a.
template <class T, class P, class Q>
constexpr Activation<T, P> operator*(Activation<T, P>&& a, Activation<T, Q> const& b) {
  detail::check_product_layouts<P, Q>();
  detail::check_same_shape("*", a.local, b.local);
  a.local.array() *= b.local.array();
  return {std::move(a.local)};
}
/// The element-wise product, written into the temporary b.
template <class T, class P, class Q>
constexpr Activation<T, P> operator*(Activation<T, P> const& a, Activation<T, Q>&& b) {
  detail::check_same_shape("*", a.local, b.local);  // first, so the error names the operands in the caller's order
  return {(std::move(b) * a).local};
}
/// The element-wise product of two temporaries, written into a.
template <class T, class P, class Q>
constexpr Activation<T, P> operator*(Activation<T, P>&& a, Activation<T, Q>&& b) {
  return std::move(a) * static_cast<Activation<T, Q> const&>(b);
}

/// The element-wise sum, in a's layout.
template <class T, class P, class Q>
constexpr Activation<T, P> operator+(Activation<T, P> const& a, Activation<T, Q> const& b) {
  detail::check_sum_layouts<P, Q>();
  detail::check_same_shape("+", a.local, b.local);
  return {a.local + b.local};
}
/// The element-wise sum, written into the temporary a.
template <class T, class P, class Q>
constexpr Activation<T, P> operator+(Activation<T, P>&& a, Activation<T, Q> const& b) {
  detail::check_sum_layouts<P, Q>();
  detail::check_same_shape("+", a.local, b.local);
  a.local += b.local;
  return {std::move(a.local)};
}
/// The element-wise sum, written into the temporary b.
template <class T, class P, class Q>
constexpr Activation<T, P> operator+(Activation<T, P> const& a, Activation<T, Q>&& b) {
  detail::check_same_shape("+", a.local, b.local);  // first, so the error names the operands in the caller's order
  return {(std::move(b) + a).local};
}
/// The element-wise sum of two temporaries, written into a.
template <class T, class P, class Q>
constexpr Activation<T, P> operator+(Activation<T, P>&& a, Activation<T, Q>&& b) {
  return std::move(a) + static_cast<Activation<T, Q> const&>(b);
}

}  // namespace shardwise

#pragma once
// xtensor types as shardwise tensors: xt::xtensor<T, N> (static rank) and xt::xarray<T> (rank known at run
// time), row- or column-major.
#include <cstddef>
#include <xtensor/xarray.hpp>
#include <xtensor/xtensor.hpp>

#include "shardwise/core/error.hpp"
#include "shardwise/tensor/concept.hpp"

namespace shardwise {

namespace detail {

/// The storage order of an xtensor layout, checked where the traits are instantiated: a base class's
/// static_assert fires with the class (clang instantiates a static member's initializer only when it is used).
template <xt::layout_type L>
struct xtensor_layout {
  static_assert(L == xt::layout_type::row_major || L == xt::layout_type::column_major,
                "shardwise::tensor_traits<xtensor>: the layout must be fixed at compile time; use "
                "xt::layout_type::row_major or xt::layout_type::column_major");
  /// Row-major or column-major, as L.
  static constexpr storage_order order =
      L == xt::layout_type::row_major ? storage_order::row_major : storage_order::col_major;
};

template <class Container, class Shape>
extents xtensor_extents(Shape const& shape) {
  extents e;
  if (shape.size() > max_rank)
    fail("shardwise::tensor_traits<xtensor>: rank ", shape.size(), " exceeds shardwise's maximum of ", max_rank);
  e.rank = shape.size();
  for (std::size_t i = 0; i < e.rank; ++i) e[i] = static_cast<std::size_t>(shape[i]);
  return e;
}

}  // namespace detail

/// An xt::xtensor<T, N>: rank N, the storage order its (compile-time) layout.
template <class EC, std::size_t N, xt::layout_type L, class Tag>
struct tensor_traits<xt::xtensor_container<EC, N, L, Tag>> : detail::xtensor_layout<L> {
  using type = xt::xtensor_container<EC, N, L, Tag>;  ///< The tensor type.
  using element_type = typename type::value_type;     ///< The tensor's value type.
  static constexpr std::size_t rank = N;              ///< N.

  static extents shape(type const& t) { return detail::xtensor_extents<type>(t.shape()); }  ///< The tensor's shape.
  static element_type* data(type& t) { return t.data(); }              ///< The tensor's contiguous storage.
  static element_type const* data(type const& t) { return t.data(); }  ///< The tensor's contiguous storage.
  /// A tensor of shape `e`; throws if the rank is not N.
  static type make(extents const& e) {
    if (e.rank != N)
      detail::fail("shardwise::tensor_traits<xt::xtensor>: cannot make a rank-", N, " tensor of shape ", e);
    typename type::shape_type shape{};
    for (std::size_t i = 0; i < N; ++i) shape[i] = e[i];
    return type(shape);
  }
};

/// An xt::xarray<T>: the rank known at run time, the storage order its (compile-time) layout.
template <class EC, xt::layout_type L, class SC, class Tag>
struct tensor_traits<xt::xarray_container<EC, L, SC, Tag>> : detail::xtensor_layout<L> {
  using type = xt::xarray_container<EC, L, SC, Tag>;  ///< The array type.
  using element_type = typename type::value_type;     ///< The array's value type.
  static constexpr std::size_t rank = dynamic_rank;   ///< Known at run time only.

  static extents shape(type const& t) { return detail::xtensor_extents<type>(t.shape()); }  ///< The array's shape.
  static element_type* data(type& t) { return t.data(); }              ///< The array's contiguous storage.
  static element_type const* data(type const& t) { return t.data(); }  ///< The array's contiguous storage.
  /// An array of shape `e`.
  static type make(extents const& e) {
    typename type::shape_type shape(e.rank);
    for (std::size_t i = 0; i < e.rank; ++i) shape[i] = e[i];
    return type(shape);
  }
};

}  // namespace shardwise

#pragma once
// What shardwise needs of a tensor, asked through tensor_traits<T> so that third-party types join
// without wrappers. Adapters for Eigen and xtensor live in shardwise/adapters/.
#include <concepts>
#include <cstddef>
#include <type_traits>

#include "shardwise/core/show.hpp"
#include "shardwise/tensor/extents.hpp"

namespace shardwise {

/// Specialise for a tensor type. Required members:
///   using element_type;                       trivially copyable element
///   static constexpr std::size_t rank;        number of dimensions, or dynamic_rank
///   static constexpr storage_order order;     row_major (last dim contiguous) or col_major
///   static extents shape(T const&);
///   static element_type* data(T&);  static element_type const* data(T const&);   contiguous storage
/// Optional, for tensors shardwise may create or resize (not for views such as Eigen::Map):
///   static T make(extents const&);
template <class T>
struct tensor_traits;  // no definition: a type without a specialization is not a tensor

namespace detail {
template <class T>
using traits_of = tensor_traits<std::remove_cvref_t<T>>;
}

/// The parts of the tensor concept, named so a failed check says which part is missing.
template <class T>
concept tensor_has_traits = requires { typename detail::traits_of<T>::element_type; };

template <class T>
concept tensor_has_element =
    tensor_has_traits<T> && std::is_trivially_copyable_v<typename detail::traits_of<T>::element_type>;

template <class T>
concept tensor_has_shape = tensor_has_traits<T> && requires(std::remove_cvref_t<T> const& t) {
  { detail::traits_of<T>::rank } -> std::convertible_to<std::size_t>;
  { detail::traits_of<T>::order } -> std::convertible_to<storage_order>;
  { detail::traits_of<T>::shape(t) } -> std::same_as<extents>;
};

template <class T>
concept tensor_has_storage =
    tensor_has_traits<T> && requires(std::remove_cvref_t<T>& t, std::remove_cvref_t<T> const& c) {
      { detail::traits_of<T>::data(t) } -> std::convertible_to<typename detail::traits_of<T>::element_type*>;
      { detail::traits_of<T>::data(c) } -> std::convertible_to<typename detail::traits_of<T>::element_type const*>;
    };

template <class T>
concept tensor = tensor_has_element<T> && tensor_has_shape<T> && tensor_has_storage<T>;

/// A tensor shardwise can create with a given shape (collective outputs, distributed tensor shards).
template <class T>
concept creatable_tensor = tensor<T> && requires(extents const& e) {
  { detail::traits_of<T>::make(e) } -> std::same_as<std::remove_cvref_t<T>>;
};

template <tensor T>
using element_t = typename detail::traits_of<T>::element_type;

template <tensor T>
inline constexpr std::size_t rank_v = detail::traits_of<T>::rank;

template <tensor T>
[[nodiscard]] extents shape_of(T const& t) {
  return detail::traits_of<T>::shape(t);
}
template <tensor T>
[[nodiscard]] auto data_of(T& t) {
  return detail::traits_of<T>::data(t);
}
template <creatable_tensor T>
[[nodiscard]] std::remove_cvref_t<T> make_tensor(extents const& e) {
  return detail::traits_of<T>::make(e);
}

namespace detail {
template <class T>
struct show_type_that_is_not_a_tensor;  // incomplete on purpose: the diagnostic prints T

/// Explains, part by part, why T is not a tensor. Call as check_tensor<T>() in a function that needs one.
template <class T>
constexpr bool check_tensor() {
  static_assert(tensor_has_traits<T>,
                "shardwise::tensor: this type has no shardwise::tensor_traits specialization; include "
                "shardwise/adapters/eigen.hpp or shardwise/adapters/xtensor.hpp, or specialize "
                "shardwise::tensor_traits for your type");
  if constexpr (tensor_has_traits<T>) {
    static_assert(tensor_has_element<T>, "shardwise::tensor: element_type must be trivially copyable");
    static_assert(tensor_has_shape<T>,
                  "shardwise::tensor: tensor_traits must provide rank, order and shape(t) returning "
                  "shardwise::extents");
    static_assert(tensor_has_storage<T>,
                  "shardwise::tensor: tensor_traits must provide data(t) pointing to contiguous elements");
  }
  if constexpr (!tensor<T>) {
    using offending_type [[maybe_unused]] = decltype(detail::show_incomplete<show_type_that_is_not_a_tensor<T>>());
  }
  return tensor<T>;
}

template <class T>
constexpr bool check_creatable_tensor() {
  if constexpr (check_tensor<T>()) {
    static_assert(creatable_tensor<T>,
                  "shardwise::tensor: shardwise must create tensors of this type, but tensor_traits has no "
                  "make(extents); use an owning type (Eigen::Matrix, Eigen::Tensor, xt::xtensor) instead of a "
                  "view such as Eigen::Map");
  }
  return creatable_tensor<T>;
}
}  // namespace detail

}  // namespace shardwise

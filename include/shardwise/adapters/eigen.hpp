#pragma once
// Eigen types as shardwise tensors: Matrix (dynamic or fixed size, row- or column-major; compile-time
// vectors are rank 1), Map of a Matrix with contiguous storage, and Tensor<T, N> (declared here, not included:
// Eigen's Tensor module costs every file that includes shardwise about a second of parsing; a program that uses
// Eigen::Tensor includes <unsupported/Eigen/CXX11/Tensor> itself, as it must to use the type).
#include <Eigen/Core>
#include <array>
#include <cstddef>

#include "shardwise/core/error.hpp"
#include "shardwise/tensor/concept.hpp"

namespace Eigen {
template <typename Scalar, int NumIndices, int Options, typename IndexType>
class Tensor;
}  // namespace Eigen

namespace shardwise {

namespace detail {

template <class Plain>
struct eigen_dense_traits {
  using element_type = typename Plain::Scalar;
  static constexpr bool is_vector = Plain::RowsAtCompileTime == 1 || Plain::ColsAtCompileTime == 1;
  static constexpr std::size_t rank = is_vector ? 1 : 2;
  static constexpr storage_order order = (static_cast<int>(Plain::Options) & static_cast<int>(Eigen::RowMajor))
                                             ? storage_order::row_major
                                             : storage_order::col_major;

  template <class M>
  static extents shape(M const& m) {
    if constexpr (is_vector)
      return {static_cast<std::size_t>(m.size())};
    else
      return {static_cast<std::size_t>(m.rows()), static_cast<std::size_t>(m.cols())};
  }
};

}  // namespace detail

/// An Eigen::Matrix: rank 2, or rank 1 when a compile-time vector; the storage order is the Matrix's.
template <class Scalar, int Rows, int Cols, int Options, int MaxRows, int MaxCols>
struct tensor_traits<Eigen::Matrix<Scalar, Rows, Cols, Options, MaxRows, MaxCols>>
    : detail::eigen_dense_traits<Eigen::Matrix<Scalar, Rows, Cols, Options, MaxRows, MaxCols>> {
  using type = Eigen::Matrix<Scalar, Rows, Cols, Options, MaxRows, MaxCols>;  ///< The matrix type.
  using base = detail::eigen_dense_traits<type>;  ///< Gives element_type, rank, order and shape.

  static Scalar* data(type& m) { return m.data(); }              ///< The matrix's contiguous storage.
  static Scalar const* data(type const& m) { return m.data(); }  ///< The matrix's contiguous storage.

  /// A matrix of shape `e`; throws if the rank or a fixed size does not match.
  static type make(extents const& e) {
    if (e.rank != base::rank)
      detail::fail("shardwise::tensor_traits<Eigen::Matrix>: cannot make a rank-", base::rank, " Eigen type of shape ",
                   e);
    Eigen::Index rows, cols;
    if constexpr (base::is_vector) {
      rows = Rows == 1 ? 1 : static_cast<Eigen::Index>(e[0]);
      cols = Rows == 1 ? static_cast<Eigen::Index>(e[0]) : 1;
    } else {
      rows = static_cast<Eigen::Index>(e[0]);
      cols = static_cast<Eigen::Index>(e[1]);
    }
    if ((Rows != Eigen::Dynamic && rows != Rows) || (Cols != Eigen::Dynamic && cols != Cols) ||
        (MaxRows != Eigen::Dynamic && rows > MaxRows) || (MaxCols != Eigen::Dynamic && cols > MaxCols))
      detail::fail("shardwise::tensor_traits<Eigen::Matrix>: a fixed-size ", Rows, "x", Cols,
                   " matrix cannot have shape ", e, "; use Eigen::Dynamic sizes for tensors that are sharded");
    type m;
    m.resize(rows, cols);
    return m;
  }
};

/// A Map of contiguous storage (the default stride); shardwise reads and writes it but cannot resize it.
template <class Plain, int MapOptions>
struct tensor_traits<Eigen::Map<Plain, MapOptions, Eigen::Stride<0, 0>>> : detail::eigen_dense_traits<Plain> {
  using type = Eigen::Map<Plain, MapOptions, Eigen::Stride<0, 0>>;     ///< The map type.
  using element_type = typename Plain::Scalar;                         ///< The mapped matrix's scalar.
  static element_type* data(type& m) { return m.data(); }              ///< The mapped storage.
  static element_type const* data(type const& m) { return m.data(); }  ///< The mapped storage.
};

/// An Eigen::Tensor<Scalar, N>: rank N, the storage order the tensor's.
template <class Scalar, int N, int Options, class Index>
struct tensor_traits<Eigen::Tensor<Scalar, N, Options, Index>> {
  using type = Eigen::Tensor<Scalar, N, Options, Index>;            ///< The tensor type.
  using element_type = Scalar;                                      ///< The tensor's scalar.
  static constexpr std::size_t rank = static_cast<std::size_t>(N);  ///< N.
  /// Row-major when the tensor's Options say so, else column-major (Eigen's default).
  static constexpr storage_order order =
      (Options & Eigen::RowMajor) ? storage_order::row_major : storage_order::col_major;

  /// The tensor's dimensions.
  static extents shape(type const& t) {
    extents e;
    e.rank = rank;
    for (std::size_t i = 0; i < rank; ++i) e[i] = static_cast<std::size_t>(t.dimension(static_cast<Index>(i)));
    return e;
  }
  static Scalar* data(type& t) { return t.data(); }              ///< The tensor's contiguous storage.
  static Scalar const* data(type const& t) { return t.data(); }  ///< The tensor's contiguous storage.
  /// A tensor of shape `e`; throws if the rank is not N.
  static type make(extents const& e) {
    if (e.rank != rank)
      detail::fail("shardwise::tensor_traits<Eigen::Tensor>: cannot make a rank-", rank, " tensor of shape ", e);
    std::array<Index, static_cast<std::size_t>(N)> dims{};
    for (std::size_t i = 0; i < rank; ++i) dims[i] = static_cast<Index>(e[i]);
    return type(dims);
  }
};

}  // namespace shardwise

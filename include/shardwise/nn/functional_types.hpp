#pragma once
// The matrix types of the nn kernels (row-major: rows are tokens, columns are features) and their shape checks.
#include <Eigen/Core>
#include <concepts>

#include "shardwise/core/error.hpp"

namespace shardwise::nn {

template <class T>
using matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;

/// Writable views: a matrix, a Map or a block with contiguous rows (any row stride, so a column slice of a wider
/// row-major matrix works).
template <class T>
using matrix_ref = Eigen::Ref<matrix<T>>;
template <class T>
using vector_ref = Eigen::Ref<vector<T>>;
/// Read-only views; a source of another layout is copied into the Ref.
template <class T>
using const_matrix_ref = Eigen::Ref<const matrix<T>>;
template <class T>
using const_vector_ref = Eigen::Ref<const vector<T>>;

}  // namespace shardwise::nn

// Internals go in shardwise::detail, not nn::detail: a namespace nn::detail would hide shardwise::detail from code
// in shardwise::nn that names detail::something.
namespace shardwise::detail {

inline void nn_check_shape(char const* fn, char const* what, Eigen::Index rows, Eigen::Index cols,
                           Eigen::Index want_rows, Eigen::Index want_cols) {
  if (rows != want_rows || cols != want_cols)
    fail("shardwise::nn::", fn, ": ", what, " is ", rows, "x", cols, ", expected ", want_rows, "x", want_cols,
         "; outputs are not resized, so pass buffers of the expected shape");
}
template <class M>
void nn_check_shape(char const* fn, char const* what, M const& m, Eigen::Index want_rows, Eigen::Index want_cols) {
  nn_check_shape(fn, what, m.rows(), m.cols(), want_rows, want_cols);
}
template <class V>
void nn_check_size(char const* fn, char const* what, V const& v, Eigen::Index want) {
  if (v.size() != want)
    fail("shardwise::nn::", fn, ": ", what, " has ", v.size(), " elements, expected ", want,
         "; outputs are not resized, so pass buffers of the expected size");
}

}  // namespace shardwise::detail

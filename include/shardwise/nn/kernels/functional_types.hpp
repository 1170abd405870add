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

namespace shardwise::detail {
/// The Eigen settings the separately compiled kernels (SHARDWISE_SEPARATE_KERNELS) were built with. A file built
/// with others (say -mavx, which changes Eigen's alignment and allocator) must not call them: its link fails on an
/// undefined `separate_kernels_compiled_with<alignment, blas>::same_eigen_flags_as_this_file`, naming the file's.
template <int AlignBytes, bool UsesBlas>
struct separate_kernels_compiled_with {
  static bool const same_eigen_flags_as_this_file;
};
#if defined(EIGEN_USE_BLAS)
inline constexpr bool eigen_uses_blas = true;
#else
inline constexpr bool eigen_uses_blas = false;
#endif
}  // namespace shardwise::detail

#if defined(SHARDWISE_SEPARATE_KERNELS) && !defined(SHARDWISE_DETAIL_COMPILING_KERNELS)
namespace shardwise::detail {
// Every file that declares the kernels extern refers to the library's symbol for its own settings. An internal
// variable with a volatile read: clang drops an unused inline variable, and an optimiser may drop a plain read.
[[maybe_unused]] static bool const separate_kernels_flags_checked = *static_cast<bool const volatile*>(
    &separate_kernels_compiled_with<EIGEN_MAX_ALIGN_BYTES, eigen_uses_blas>::same_eigen_flags_as_this_file);
}  // namespace shardwise::detail
#endif

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

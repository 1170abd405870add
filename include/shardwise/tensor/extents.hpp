#pragma once
// A tensor shape of at most max_rank dimensions, held by value (no allocation on the collective path).
#include <array>
#include <cstddef>
#include <initializer_list>
#include <ostream>

#include "shardwise/core/error.hpp"

namespace shardwise {

/// The most dimensions a tensor may have.
inline constexpr std::size_t max_rank = 8;
/// tensor_traits<T>::rank for tensors whose rank is known only at run time (xt::xarray).
inline constexpr std::size_t dynamic_rank = static_cast<std::size_t>(-1);

/// How a tensor's elements are laid out: row_major means the last dimension is contiguous.
enum class storage_order { row_major, col_major };

/// A tensor shape: `rank` sizes, at most max_rank.
struct extents {
  std::array<std::size_t, max_rank> dims{};  ///< The sizes; only the first `rank` count.
  std::size_t rank = 0;                      ///< The number of dimensions.

  constexpr extents() = default;  ///< Rank 0.
  /// The sizes in `list`; throws for more than max_rank.
  constexpr extents(std::initializer_list<std::size_t> list) {
    if (list.size() > max_rank) detail::fail("shardwise::extents: at most ", max_rank, " dimensions are supported");
    for (std::size_t d : list) dims[rank++] = d;
  }
  [[nodiscard]] constexpr std::size_t operator[](std::size_t i) const { return dims[i]; }  ///< Size i.
  [[nodiscard]] constexpr std::size_t& operator[](std::size_t i) { return dims[i]; }       ///< Size i.
  /// The number of elements: the product of the sizes (1 for rank 0).
  [[nodiscard]] constexpr std::size_t elements() const {
    std::size_t n = 1;
    for (std::size_t i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
  /// Equal when the ranks and the sizes are.
  constexpr bool operator==(extents const& other) const {
    if (rank != other.rank) return false;
    for (std::size_t i = 0; i < rank; ++i)
      if (dims[i] != other.dims[i]) return false;
    return true;
  }
  /// Prints "[2, 3]".
  friend std::ostream& operator<<(std::ostream& out, extents const& e) {
    out << '[';
    for (std::size_t i = 0; i < e.rank; ++i) out << (i ? ", " : "") << e.dims[i];
    return out << ']';
  }
};

}  // namespace shardwise

#pragma once
// Copying rectangular sub-blocks ("boxes") between tensors of the same storage order. Every collective
// along a tensor dimension is a set of such copies; contiguous runs are merged so a box that covers whole
// rows becomes one memcpy.
#include <cstddef>
#include <cstring>

#include "shardwise/tensor/extents.hpp"

namespace shardwise::detail {

/// Calls run(a_index, b_index, length) for each contiguous run of a box of `size` elements that starts at
/// `a_offset` in a tensor of shape `a_shape` and at `b_offset` in one of shape `b_shape`.
template <class Run>
void for_each_run(extents const& a_shape, extents const& a_offset, extents const& b_shape, extents const& b_offset,
                  extents const& size, storage_order order, Run&& run) {
  std::size_t const rank = size.rank;
  if (size.elements() == 0) return;
  if (rank == 0) {
    run(std::size_t{0}, std::size_t{0}, std::size_t{1});
    return;
  }
  // Dimensions in memory order, outermost first.
  std::size_t count[max_rank], a_full[max_rank], b_full[max_rank], a_start[max_rank], b_start[max_rank];
  for (std::size_t k = 0; k < rank; ++k) {
    std::size_t const d = order == storage_order::row_major ? k : rank - 1 - k;
    count[k] = size[d];
    a_full[k] = a_shape[d];
    b_full[k] = b_shape[d];
    a_start[k] = a_offset[d];
    b_start[k] = b_offset[d];
  }
  std::size_t a_stride[max_rank], b_stride[max_rank];
  a_stride[rank - 1] = b_stride[rank - 1] = 1;
  for (std::size_t k = rank - 1; k > 0; --k) {
    a_stride[k - 1] = a_stride[k] * a_full[k];
    b_stride[k - 1] = b_stride[k] * b_full[k];
  }
  std::size_t a_base = 0, b_base = 0;
  for (std::size_t k = 0; k < rank; ++k) {
    a_base += a_start[k] * a_stride[k];
    b_base += b_start[k] * b_stride[k];
  }
  // Merge inner dimensions that the box covers completely in both tensors into one contiguous run.
  std::size_t inner = rank - 1;
  std::size_t length = count[inner];
  while (inner > 0 && count[inner] == a_full[inner] && count[inner] == b_full[inner]) {
    --inner;
    length *= count[inner];
  }
  // inner is now the outermost dimension folded into `length`; iterate the ones outside it.
  std::size_t const outer_dims = inner;
  std::size_t index[max_rank] = {};
  std::size_t a_pos = a_base, b_pos = b_base;
  while (true) {
    run(a_pos, b_pos, length);
    std::size_t k = outer_dims;
    while (k > 0) {
      --k;
      if (++index[k] < count[k]) {
        a_pos += a_stride[k];
        b_pos += b_stride[k];
        break;
      }
      a_pos -= (count[k] - 1) * a_stride[k];
      b_pos -= (count[k] - 1) * b_stride[k];
      index[k] = 0;
      if (k == 0) return;
    }
    if (outer_dims == 0) return;
  }
}

/// memcpy of n elements that allows n == 0 with null pointers (an empty shard has no storage).
template <class T>
void copy_elements(T* dst, T const* src, std::size_t n) {
  if (n) std::memcpy(dst, src, n * sizeof(T));
}

/// Copies the box of `size` at `src_offset` in src into dst at `dst_offset`.
template <class T>
void copy_box(T const* src, extents const& src_shape, extents const& src_offset, T* dst, extents const& dst_shape,
              extents const& dst_offset, extents const& size, storage_order order) {
  for_each_run(dst_shape, dst_offset, src_shape, src_offset, size, order,
               [&](std::size_t d, std::size_t s, std::size_t n) { std::memcpy(dst + d, src + s, n * sizeof(T)); });
}

/// A box's offset of all zeros, of the given rank.
inline extents zero_offset(std::size_t rank) {
  extents e;
  e.rank = rank;
  return e;
}

/// The same extents with dimension d replaced.
inline extents with_dim(extents e, std::size_t d, std::size_t value) {
  e[d] = value;
  return e;
}

}  // namespace shardwise::detail

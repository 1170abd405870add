#pragma once
// Shard sizes follow torch.chunk, so shards line up with PyTorch's DTensor rank for rank.
#include <algorithm>
#include <cstddef>

namespace shardwise {

/// Size of piece `index` when `total` is cut into `pieces` like torch.chunk: ceil(total / pieces) each,
/// the last pieces shorter, possibly empty (total 5 over 4 ranks: 2, 2, 1, 0).
[[nodiscard]] constexpr std::size_t chunk_size(std::size_t total, std::size_t pieces, std::size_t index) {
  std::size_t const full = (total + pieces - 1) / pieces;
  std::size_t const start = std::min(total, full * index);
  return std::min(full, total - start);
}

/// Where piece `index` starts.
[[nodiscard]] constexpr std::size_t chunk_offset(std::size_t total, std::size_t pieces, std::size_t index) {
  std::size_t const full = (total + pieces - 1) / pieces;
  return std::min(total, full * index);
}

/// The one shard-size rule of every layer, its cost and its checks: a dimension of `total` on piece `index` of
/// `pieces` when a style cuts it (chunk_size), else the whole. A layer checks, or pads, before it cuts, so its pieces
/// are equal; a cost takes piece 0, the largest.
[[nodiscard]] constexpr std::size_t shard_extent(std::size_t total, bool cut, std::size_t pieces,
                                                 std::size_t index = 0) {
  return cut ? chunk_size(total, pieces, index) : total;
}

/// `total` rounded up to a multiple of `pieces`, as Megatron pads a vocabulary the tp size does not divide.
[[nodiscard]] constexpr std::size_t padded_to_multiple(std::size_t total, std::size_t pieces) {
  return (total + pieces - 1) / pieces * pieces;
}

}  // namespace shardwise

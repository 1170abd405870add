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

}  // namespace shardwise

#pragma once
// The sizes of a context-parallel cut as constexpr arithmetic (no Eigen): how many tokens of each sequence a cp
// rank holds, for sw::context_split and for the cost model (cost_inputs::cp).
#include <cstddef>
#include <string_view>

namespace shardwise {

/// How attention reaches across the cp ranks: keys and values passed round a ring (any head count), or an
/// all-to-all to whole sequences of heads / cp heads (the heads and key-value heads must divide over cp).
enum class context_method { ring, all_to_all };

/// A context-parallel axis as the cost model sees it: its size, this rank on it, the sequence it cuts and how.
struct context_inputs {
  std::size_t ranks = 1;                         ///< Ranks on the cp axis (1: not context-parallel).
  std::size_t rank = 0;                          ///< This rank's coordinate on it.
  std::size_t sequence = 0;                      ///< Tokens per whole sequence.
  bool balanced = true;                          ///< Head-tail chunks (context_split::balanced).
  context_method method = context_method::ring;  ///< Ring or all-to-all.
  std::string_view axis = "cp";                  ///< The axis' name, as the mesh calls it.

  /// Tokens of each sequence that rank r holds (context_split::tokens).
  [[nodiscard]] constexpr std::size_t tokens(std::size_t r) const {
    std::size_t const chunks = balanced ? 2 * ranks : ranks;
    auto const chunk = [&](std::size_t c) { return sequence / chunks + (c < sequence % chunks ? 1 : 0); };
    return balanced ? chunk(r) + chunk(2 * ranks - 1 - r) : chunk(r);
  }
};

}  // namespace shardwise

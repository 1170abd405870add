#pragma once
// Grouped-query attention's heads under tensor parallelism, for any attention module that cuts its projections by
// heads: whether a tp size can serve the query and key-value heads (at compile time for static sizes, at
// parallelize otherwise), and the key-value heads repeated in the key and value projections when there are more
// ranks than key-value heads (kv_size_multiplier, as optimum-neuron's GQA layers do).
#include <cstddef>
#include <string_view>

#include "shardwise/core/error.hpp"
#include "shardwise/core/show.hpp"
#include "shardwise/mesh/mesh.hpp"
#include "shardwise/models/llama_config.hpp"
#include "shardwise/plan/plan.hpp"

namespace shardwise::models {

namespace detail {
template <fixed_string Path, std::size_t Heads, std::size_t KvHeads, std::size_t Ranks,
          class Spelled = shardwise::detail::spelled_t<Path>>
struct tp_cannot_serve_heads_at;  // incomplete on purpose: the diagnostic spells the path and the counts
}  // namespace detail

/// The heads of grouped-query attention: `heads` query heads of `head_dim` columns sharing `kv_heads` key-value
/// heads; `kv_size_multiplier` repeats each key-value head (0: the repetition a tp size needs, derived).
struct grouped_heads {
  std::size_t heads = 0;               ///< Query heads.
  std::size_t kv_heads = 0;            ///< Key-value heads (heads for multi-head attention).
  std::size_t head_dim = 0;            ///< Columns of one head.
  std::size_t kv_size_multiplier = 0;  ///< Copies of each key-value head under tp (0: derived).

  /// The heads of a Llama config.
  static constexpr grouped_heads of(LlamaConfig const& c) {
    return {c.heads, c.kv_heads, c.head_dim(), c.kv_size_multiplier};
  }

  /// The copies of each key-value head that `tp` ranks hold (tp 0, before parallelize: 1). A tp size that cannot
  /// serve the heads is refused, naming `model`, the attention's plan `path` and the counts.
  constexpr std::size_t kv_copies(std::size_t tp, std::string_view model, std::string_view path) const {
    if (tp == 0) return 1;
    std::size_t const m = models::kv_size_multiplier(heads, kv_heads, tp, kv_size_multiplier);
    if (m == 0)
      shardwise::raise(model, " at \"", path, "\": ", tp, " ranks cannot serve ", heads, " heads and ", kv_heads,
                       " key-value heads with kv_size_multiplier ", kv_size_multiplier,
                       " (0: derived); the heads must divide over the ranks, and the ranks must divide the "
                       "key-value heads or be a multiple of them: choose another tp size");
    return m;
  }

  /// For a module declared with static head counts (dynamic_size: any): refuses other counts, naming the module
  /// and its plan path.
  template <std::size_t StaticHeads, std::size_t StaticKvHeads>
  constexpr void require_declared(std::string_view module, std::string_view path) const {
    if ((StaticHeads != dynamic_size && heads != StaticHeads) ||
        (StaticKvHeads != dynamic_size && kv_heads != StaticKvHeads))
      shardwise::raise(module, " at \"", path, "\": declared with ", StaticHeads, " heads and ", StaticKvHeads,
                       " key-value heads but built from a config with ", heads, " and ", kv_heads);
  }

  /// For a module's shardwise_on_parallelize, before the layers are cut: repeats each key-value head of `wk` and
  /// `wv` as `tp` ranks need, so that every rank holds the ones its query heads use.
  template <class Keys, class Values>
  constexpr void repeat_kv_heads(Keys& wk, Values& wv, int tp, std::string_view model, std::string_view path) const {
    std::size_t const m = kv_copies(static_cast<std::size_t>(tp), model, path);
    wk.replicate_output_blocks(head_dim, m);
    wv.replicate_output_blocks(head_dim, m);
  }
};

/// For a module's shardwise_static_check: whether a static tp size of `Ranks` serves `Heads` query and `KvHeads`
/// key-value heads; if not, a compile error naming the module's plan path and the counts. Either count
/// dynamic_size: checked at parallelize instead.
template <fixed_string Path, std::size_t Heads, std::size_t KvHeads, std::size_t Ranks>
constexpr bool static_heads_servable() {
  if constexpr (Heads == dynamic_size || KvHeads == dynamic_size) {
    return true;
  } else {
    constexpr bool ok = kv_size_multiplier(Heads, KvHeads, Ranks) != 0;
    static_assert(ok,
                  "shardwise::models::LlamaAttention: the tp size cannot serve these heads: the query heads must "
                  "divide over tp, and tp must divide the key-value heads or be a multiple of them "
                  "(kv_size_multiplier); choose another tp size");
    if constexpr (!ok) {
      using offending [[maybe_unused]] =
          decltype(shardwise::detail::show_incomplete<detail::tp_cannot_serve_heads_at<Path, Heads, KvHeads, Ranks>>());
    }
    return ok;
  }
}

}  // namespace shardwise::models

#pragma once
// The heads of causal attention over rows of whole sequences, as a child of the module that computes it: their
// count, their width and the sequence they span, with the checks each fact needs where it is known. An attention
// module that cuts its projections by heads (ColwiseParallel on q, k and v) lists it among its children and writes
// no hook of its own: sw::parallelize calls the heads'.
#include <cstddef>
#include <string_view>

#include "shardwise/core/error.hpp"
#include "shardwise/nn/layers/layer_common.hpp"
#include "shardwise/plan/hooks.hpp"
#include "shardwise/plan/members.hpp"
#include "shardwise/plan/plan.hpp"

namespace shardwise {

/// Causal attention's heads, for a module at Plan's path (the module passes its own Plan): `heads` heads of
/// `head_dim` features over rows of whole sequences of `sequence` tokens. StaticHeads (optional): the head count
/// known at compile time, so that a static tp size that does not divide it does not compile. Checked with the
/// module's path in every message: the count built against StaticHeads (at construction), a static tp size (at
/// compile time) and the tp group's size (at parallelize, on every rank).
template <class Plan, std::size_t StaticHeads = dynamic_size>
struct attention_heads {
  std::size_t heads;     ///< Heads of the whole module (each tp rank computes heads / tp of them).
  std::size_t head_dim;  ///< Features per head.
  std::size_t sequence;  ///< Tokens per sequence: the rows are whole sequences of it.
  SHARDWISE_CHILDREN()
  SHARDWISE_HOOKS(static_check, on_parallelize)
  SHARDWISE_SAVED()

  /// `count` heads over `features` features (head_dim = features / count) on sequences of `length` tokens; throws
  /// if StaticHeads says another count or the heads do not split the features.
  attention_heads(std::size_t features, std::size_t count, std::size_t length)
      : heads(count), head_dim(count == 0 ? 0 : features / count), sequence(length) {
    if (count == 0 || features % count != 0)
      raise("shardwise::attention_heads at \"", path(), "\": ", features, " features do not split into ", count,
            " heads; choose a head count that divides the features");
    if (StaticHeads != dynamic_size && count != StaticHeads)
      raise("shardwise::attention_heads at \"", path(), "\": declared with ", StaticHeads, " heads but built with ",
            count, "; build it with the declared count or declare this one");
  }

  /// Called by sw::parallelize when the tp size is static: the declared heads must divide over it.
  template <std::size_t Ranks>
  static constexpr bool shardwise_static_check() {
    constexpr bool ok = StaticHeads == dynamic_size || StaticHeads % Ranks == 0;
    static_assert(ok,
                  "shardwise::ColwiseParallel on attention: the heads do not divide over the tp size; choose a "
                  "head count the tp size divides");
    constexpr bool named = static_divides<own_style<Plan>::path, StaticHeads, Ranks>();  // spells the sizes
    return ok && named;
  }

  /// Called by sw::parallelize before any layer is cut: the heads must split whole over the group.
  void shardwise_on_parallelize(int tp_size) const { require_divides(path(), "heads", heads, tp_size); }

 private:
  static constexpr std::string_view path() { return own_style<Plan>::path.view(); }
};

}  // namespace shardwise

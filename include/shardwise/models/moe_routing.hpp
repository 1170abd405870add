#pragma once
// Where a mixture of experts sent one forward's tokens (models::moe_routing), what its load-balancing loss counts
// of it (models::moe_balance), and that loss pooled over a model's blocks (models::load_balancing_loss).
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardwise/core/error.hpp"

namespace shardwise::models {

/// Where one forward sent its tokens: for each token, its top_k experts and their weights, and for each expert, the
/// (token, slot) pairs it computed, in token order.
struct moe_routing {
  std::size_t tokens = 0;             ///< Tokens of the forward.
  std::size_t top_k = 0;              ///< Experts per token.
  std::vector<std::uint32_t> chosen;  ///< tokens x top_k expert indices, best first.
  /// Per expert: the (token, slot) pairs it computed, in token order (without those its capacity dropped).
  std::vector<std::vector<std::pair<std::uint32_t, std::uint32_t>>> routed;
  std::vector<std::size_t> demand;  ///< Per expert: how many slots chose it, before any capacity.

  /// How many slots chose `expert` (what the load-balancing loss and the bias update count).
  [[nodiscard]] std::size_t load(std::size_t expert) const { return demand[expert]; }
  /// How many of them it computed (fewer than load() where its capacity dropped some).
  [[nodiscard]] std::size_t computed(std::size_t expert) const { return routed[expert].size(); }
};

/// What the load-balancing loss counts of one forward of a MoeFeedForward: its tokens, and per expert the slots
/// that chose it and the sum of its scores over the tokens.
struct moe_balance {
  std::size_t tokens = 0;          ///< Tokens of the forward.
  std::vector<std::size_t> loads;  ///< Per expert: the slots that chose it (moe_routing::load).
  std::vector<double> score_sums;  ///< Per expert: its scores summed over the tokens.
};

/// transformers' load_balancing_loss_func over several blocks' last forwards, as a model of MoE layers computes
/// it from all its layers' router logits: experts * sum_e (share of all the blocks' slots per row that went to e) *
/// (mean score of e over all their rows). Each block's backward then adds this loss's gradient, times its
/// router_aux_loss_coef, instead of its own loss's. `blocks`: a range of MoeFeedForward, or of pointers to them,
/// all with the same number of experts.
template <class Blocks>
  requires requires(Blocks& b) { b.begin() != b.end(); }
double load_balancing_loss(Blocks&& blocks) {
  auto block = [](auto& b) -> auto& {
    if constexpr (std::is_pointer_v<std::remove_cvref_t<decltype(b)>>)
      return *b;
    else
      return b;
  };
  std::vector<double> slots, score_sums;
  double rows = 0;
  for (auto&& b : blocks) {
    auto& m = block(b);
    std::size_t const count = m.config().experts;
    if (slots.empty()) slots.assign(count, 0.0), score_sums.assign(count, 0.0);
    if (count != slots.size())
      shardwise::raise("shardwise::models::load_balancing_loss: blocks of ", slots.size(), " and ", count,
                       " experts; the loss pools blocks of one expert count");
    moe_balance const& counted = m.balance();
    for (std::size_t e = 0; e < slots.size(); ++e)
      slots[e] += static_cast<double>(counted.loads[e]), score_sums[e] += counted.score_sums[e];
    rows += static_cast<double>(counted.tokens);
  }
  std::vector<double> share(slots.size());
  double loss = 0;
  for (std::size_t e = 0; rows > 0 && e < slots.size(); ++e)  // no rows (an ep rank with no tokens): no loss
    share[e] = slots[e] / rows, loss += share[e] * score_sums[e] / rows;
  for (auto&& b : blocks) block(b).use_pooled_loads(share, rows);
  return loss * static_cast<double>(slots.size());
}

}  // namespace shardwise::models

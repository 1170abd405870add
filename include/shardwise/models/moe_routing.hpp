#pragma once
// Where a mixture of experts sent one forward's tokens (models::moe_routing), what its load-balancing loss counts
// of it (models::moe_balance), and that loss pooled over a model's blocks (models::load_balancing_loss).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
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

/// What transformers' load-balancing loss pools over a model's blocks (load_balancing_loss_func over all their
/// router logits): per expert the slots that chose it and the sum of its scores, and the rows counted (each block's
/// tokens, once per block).
struct router_totals {
  std::vector<double> slots;       ///< Per expert: the slots that chose it.
  std::vector<double> score_sums;  ///< Per expert: its scores summed over the rows.
  double rows = 0;                 ///< The rows counted: tokens times blocks.

  /// Adds one block's last forward; blocks of another expert count are refused.
  void add(moe_balance const& block) {
    if (slots.empty()) slots.assign(block.loads.size(), 0.0), score_sums.assign(block.loads.size(), 0.0);
    if (block.loads.size() != slots.size())
      shardwise::raise("shardwise::models::load_balancing_loss: blocks of ", slots.size(), " and ", block.loads.size(),
                       " experts; the loss pools blocks of one expert count");
    for (std::size_t e = 0; e < slots.size(); ++e)
      slots[e] += static_cast<double>(block.loads[e]), score_sums[e] += block.score_sums[e];
    rows += static_cast<double>(block.tokens);
  }
  /// Each expert's slots per row: what the loss's gradient with respect to a score counts (0 without rows).
  [[nodiscard]] std::vector<double> shares() const {
    std::vector<double> share(slots.size(), 0.0);
    for (std::size_t e = 0; rows > 0 && e < slots.size(); ++e) share[e] = slots[e] / rows;
    return share;
  }
  /// experts * sum_e (slots per row of e) * (mean score of e); 0 without rows (an ep rank with no tokens).
  [[nodiscard]] double loss() const {
    double loss = 0;
    for (std::size_t e = 0; rows > 0 && e < slots.size(); ++e) loss += slots[e] / rows * score_sums[e] / rows;
    return loss * static_cast<double>(slots.size());
  }
  /// As 2 x experts + 1 numbers (the slots, the score sums, the rows), for a message between pipeline stages.
  [[nodiscard]] std::vector<double> packed() const {
    std::vector<double> all(slots);
    all.insert(all.end(), score_sums.begin(), score_sums.end());
    all.push_back(rows);
    return all;
  }
  /// The totals `packed` holds (2 x experts + 1 numbers; empty: none yet).
  static router_totals unpacked(std::span<double const> packed) {
    if (packed.empty()) return {};
    if (packed.size() % 2 != 1)
      shardwise::raise("shardwise::models::router_totals: ", packed.size(),
                       " numbers are not the slots, score sums and rows of an expert count");
    std::size_t const experts = packed.size() / 2;
    return {{packed.begin(), packed.begin() + static_cast<std::ptrdiff_t>(experts)},
            {packed.begin() + static_cast<std::ptrdiff_t>(experts), packed.end() - 1},
            packed.back()};
  }
};

/// transformers' load_balancing_loss_func over several blocks' last forwards, as a model of MoE layers computes
/// it from all its layers' router logits (router_totals::loss). Each block's backward then adds this loss's
/// gradient, times its router_aux_loss_coef and `gradient_scale` (1/microbatches under gradient accumulation), instead
/// of its own loss's. `blocks`: a range of MoeFeedForward, or of pointers to them, all with the same number of experts.
/// `sum_over_ranks`, if given, sums the totals (router_totals::packed) over the ranks that hold the other tokens of
/// the same sequences (context parallelism), so the loss is the one over all of them.
template <class Blocks>
  requires requires(Blocks& b) { b.begin() != b.end(); }
double load_balancing_loss(Blocks&& blocks, double gradient_scale = 1,
                           std::function<void(std::vector<double>&)> const& sum_over_ranks = {}) {
  auto block = [](auto& b) -> auto& {
    if constexpr (std::is_pointer_v<std::remove_cvref_t<decltype(b)>>)
      return *b;
    else
      return b;
  };
  router_totals totals;
  for (auto&& b : blocks) totals.add(block(b).balance());
  if (sum_over_ranks) {
    std::vector<double> packed = totals.packed();
    sum_over_ranks(packed);
    totals = router_totals::unpacked(packed);
  }
  std::vector<double> const share = totals.shares();
  for (auto&& b : blocks) block(b).use_pooled_loads(share, totals.rows, gradient_scale);
  return totals.loss();
}

}  // namespace shardwise::models

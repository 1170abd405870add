#pragma once
// The sizes and routing rule of a mixture-of-experts feed-forward (models::MoeConfig), apart from the layers that
// compute it (models/moe.hpp), so that a model's config can hold one (LlamaConfig::moe).
#include <cstddef>
#include <limits>
#include <map>
#include <string>

#include "shardwise/checkpoint/compiled_once.hpp"
#include "shardwise/core/error.hpp"

namespace shardwise::models {

/// Which of an expert's tokens beyond its capacity are dropped (MoeConfig::capacity_factor): those of the lowest
/// routing weights (Megatron-Core's "probs") or the last in token order ("position").
enum class moe_drop_policy { probs, position };

/// How a router scores the experts for a token: a softmax over them (Mixtral, Qwen), or each expert's sigmoid,
/// chosen among with a balancing bias (DeepSeek-V3).
enum class moe_router { softmax, sigmoid };

/// The sizes and routing rule of a mixture-of-experts feed-forward (transformers' Mixtral / Qwen3-MoE /
/// DeepSeek-V3 names in parentheses).
struct MoeConfig {
  std::size_t dim = 64;               ///< The model width (hidden_size); in a LlamaConfig, the model's dim.
  std::size_t expert_hidden = 32;     ///< Each expert's inner width (intermediate_size / moe_intermediate_size).
  std::size_t experts = 8;            ///< How many experts (num_local_experts / num_experts).
  std::size_t top_k = 2;              ///< Experts per token (num_experts_per_tok).
  bool normalize_top_k = true;        ///< Top-k probabilities renormalised to sum to one (Mixtral; norm_topk_prob).
  double router_aux_loss_coef = 0.0;  ///< Weight of the load-balancing loss in the training loss (0: none).
  bool mlp_bias = false;              ///< Biases on the experts' projections; in a LlamaConfig, the model's mlp_bias.
  /// Qwen2-MoE's shared expert: a SwiGLU of this inner width that every token passes through, its output scaled
  /// by sigmoid(shared_expert_gate x) and added (shared_expert_intermediate_size; 0: none).
  std::size_t shared_expert_hidden = 0;
  /// Whether the shared expert's output is scaled by its sigmoid gate (Qwen2-MoE) or added as it is (DeepSeek-V3).
  bool shared_expert_gated = true;
  /// The router's scores (DeepSeek-V3: sigmoid, with MoeFeedForward::score_correction_bias in the choice only).
  moe_router router = moe_router::softmax;
  /// DeepSeek-V3's group-limited routing: the experts in `groups` equal groups (n_group), a token choosing among
  /// those of its `top_groups` best groups (topk_group), a group scored by its two best biased scores.
  std::size_t groups = 1;
  std::size_t top_groups = 1;  ///< How many of the groups a token chooses among (topk_group).
  /// The chosen experts' weights are multiplied by it (DeepSeek-V3's routed_scaling_factor).
  double routed_scaling_factor = 1.0;
  /// 0: dropless (every token reaches its experts). Else each expert computes at most
  /// ceil(capacity_factor * tokens * top_k / experts) of a forward's tokens, and drops the others by drop_policy:
  /// a dropped token gets nothing from that expert, and its other weights stay as they were.
  double capacity_factor = 0.0;
  moe_drop_policy drop_policy = moe_drop_policy::probs;  ///< Which tokens an expert over its capacity drops.

  /// Raises sw::error naming the setting and the fix when the routing cannot work.
  constexpr void check() const {
    if (dim == 0 || expert_hidden == 0 || experts == 0)
      shardwise::raise("shardwise::models::MoeConfig: dim, expert_hidden and experts must be positive (got ", dim, ", ",
                       expert_hidden, ", ", experts, ")");
    constexpr std::size_t limit = std::size_t{1} << 40;  // elements in one table; far beyond any model here
    if (expert_hidden > limit / dim || experts > limit / dim || shared_expert_hidden > limit / dim)
      shardwise::raise("shardwise::models::MoeConfig: experts ", experts, ", expert_hidden ", expert_hidden,
                       " or shared_expert_hidden ", shared_expert_hidden, " times dim ", dim,
                       " overflows a table; check the sizes");
    if (top_k == 0 || top_k > experts)
      shardwise::raise("shardwise::models::MoeConfig: top_k ", top_k, " is not in [1, experts = ", experts,
                       "]; route each token to between 1 and ", experts, " experts");
    if (!finite_nonnegative(router_aux_loss_coef))
      shardwise::raise("shardwise::models::MoeConfig: router_aux_loss_coef ", router_aux_loss_coef,
                       " is not a finite weight >= 0");
    if (!finite_nonnegative(capacity_factor))
      shardwise::raise("shardwise::models::MoeConfig: capacity_factor ", capacity_factor,
                       " is not a finite factor >= 0 (0: dropless)");
    if (!finite_nonnegative(routed_scaling_factor) || routed_scaling_factor == 0)
      shardwise::raise("shardwise::models::MoeConfig: routed_scaling_factor ", routed_scaling_factor,
                       " is not a finite factor > 0");
    if (router == moe_router::sigmoid && router_aux_loss_coef != 0)
      shardwise::raise(
          "shardwise::models::MoeConfig: router_aux_loss_coef applies to the softmax router; the "
          "sigmoid router balances with its correction bias (MoeFeedForward::update_routing_bias): set "
          "router_aux_loss_coef to 0");
    check_groups();
  }

  /// The fields that decide what the experts' weights mean, as text, for the checkpoints of a model that holds
  /// them (LlamaConfig::fields).
  [[nodiscard]] std::map<std::string, std::string> fields() const;

 private:
  static constexpr bool finite_nonnegative(double v) { return v >= 0 && v <= std::numeric_limits<double>::max(); }

  constexpr void check_groups() const {
    if (groups == 0 || experts % groups != 0 || top_groups == 0 || top_groups > groups)
      shardwise::raise("shardwise::models::MoeConfig: ", experts, " experts in ", groups, " groups, choosing among ",
                       top_groups, ": the groups must divide the experts and top_groups be in [1, groups]");
    if (groups > 1 &&
        (router != moe_router::sigmoid || experts / groups < 2 || top_k > top_groups * (experts / groups)))
      shardwise::raise("shardwise::models::MoeConfig: group-limited routing (groups ", groups,
                       ") needs the sigmoid router, at least two experts per group and top_k (", top_k,
                       ") at most the experts of the top_groups groups");
  }
};

// Compiled once with checkpoint IO where shardwise::separate_checkpoint is linked (checkpoint/compiled_once.hpp).
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY std::map<std::string, std::string> MoeConfig::fields() const {
  std::map<std::string, std::string> f{{"experts", std::to_string(experts)},
                                       {"expert_hidden", std::to_string(expert_hidden)}};
  if (shared_expert_hidden != 0)
    f["shared_expert_hidden"] = std::to_string(shared_expert_hidden),
    f["shared_expert_gated"] = shared_expert_gated ? "true" : "false";
  return f;
}
#endif

}  // namespace shardwise::models

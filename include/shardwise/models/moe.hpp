#pragma once
// A mixture-of-experts feed-forward, as Mixtral's and Qwen3-MoE's sparse blocks compute it: a router (a Linear,
// dim -> experts) gives each token a softmax over the experts, the token goes to its top_k experts (SwiGLU
// feed-forwards), and its output is their outputs weighted by its probabilities for them (renormalised over the
// top_k, or not, as the config says). Dropless: every token reaches its experts. The load-balancing loss is
// transformers': experts * sum_e (share of routed slots to e) * (mean probability of e), its gradient added by
// backward with the weight router_aux_loss_coef. Each expert computes once per forward, on the rows routed to it.
// Qwen2-MoE's shared expert, optional, sees every token and is added through a sigmoid gate.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "shardwise/models/llama.hpp"
#include "shardwise/nn.hpp"

namespace shardwise::models {

/// The sizes and routing rule of a mixture-of-experts feed-forward (transformers' Mixtral / Qwen3-MoE names in
/// parentheses).
struct MoeConfig {
  std::size_t dim = 64;               ///< The model width (hidden_size).
  std::size_t expert_hidden = 32;     ///< Each expert's inner width (intermediate_size / moe_intermediate_size).
  std::size_t experts = 8;            ///< How many experts (num_local_experts / num_experts).
  std::size_t top_k = 2;              ///< Experts per token (num_experts_per_tok).
  bool normalize_top_k = true;        ///< Top-k probabilities renormalised to sum to one (Mixtral; norm_topk_prob).
  double router_aux_loss_coef = 0.0;  ///< Weight of the load-balancing loss in the training loss (0: none).
  bool mlp_bias = false;              ///< Biases on the experts' projections.
  /// Qwen2-MoE's shared expert: a SwiGLU of this inner width that every token passes through, its output scaled
  /// by sigmoid(shared_expert_gate x) and added (shared_expert_intermediate_size; 0: none).
  std::size_t shared_expert_hidden = 0;

  /// Raises sw::error naming the setting and the fix when the routing cannot work.
  void check() const {
    if (dim == 0 || expert_hidden == 0 || experts == 0)
      shardwise::raise("shardwise::models::MoeConfig: dim, expert_hidden and experts must be positive (got ", dim, ", ",
                       expert_hidden, ", ", experts, ")");
    if (top_k == 0 || top_k > experts)
      shardwise::raise("shardwise::models::MoeConfig: top_k ", top_k, " is not in [1, experts = ", experts,
                       "]; route each token to between 1 and ", experts, " experts");
    if (!std::isfinite(router_aux_loss_coef) || router_aux_loss_coef < 0)
      shardwise::raise("shardwise::models::MoeConfig: router_aux_loss_coef ", router_aux_loss_coef,
                       " is not a finite weight >= 0");
  }
  /// The config each expert (a LlamaFeedForward) is built from.
  [[nodiscard]] LlamaConfig expert_config() const { return feed_forward_config(expert_hidden); }
  /// The config the shared expert is built from.
  [[nodiscard]] LlamaConfig shared_expert_config() const { return feed_forward_config(shared_expert_hidden); }

 private:
  [[nodiscard]] LlamaConfig feed_forward_config(std::size_t hidden) const {
    LlamaConfig c;
    c.dim = dim, c.hidden = hidden, c.mlp_bias = mlp_bias;
    return c;
  }
};

/// Where one forward sent its tokens: for each token, its top_k experts and their weights, and for each expert, the
/// (token, slot) pairs it computed, in token order.
struct moe_routing {
  std::size_t tokens = 0;             ///< Tokens of the forward.
  std::size_t top_k = 0;              ///< Experts per token.
  std::vector<std::uint32_t> chosen;  ///< tokens x top_k expert indices, best first.
  std::vector<std::vector<std::pair<std::uint32_t, std::uint32_t>>> routed;  ///< Per expert: (token, slot).

  /// How many of the routed slots went to `expert`.
  [[nodiscard]] std::size_t load(std::size_t expert) const { return routed[expert].size(); }
};

/// A mixture-of-experts feed-forward in place of a dense one: forward on x [tokens, dim] gives [tokens, dim].
/// Its router is `gate` and its experts `experts.N` (transformers' Mixtral names: gate, experts.N.w1 / w3 / w2);
/// with a shared expert, `shared_expert` and `shared_expert_gate` (Qwen2-MoE's names).
template <class T, class Plan = serial_plan>
struct MoeFeedForward {
  Linear<T, style_at<Plan, "gate">> gate;                                ///< The router, dim -> experts, no bias.
  std::vector<LlamaFeedForward<T, subplan<Plan, "experts.*">>> experts;  ///< The experts (SwiGLU).
  std::optional<LlamaFeedForward<T, subplan<Plan, "shared_expert">>> shared_expert;   ///< Qwen2-MoE's, if any.
  std::optional<Linear<T, style_at<Plan, "shared_expert_gate">>> shared_expert_gate;  ///< Its gate, dim -> 1.
  SHARDWISE_CHILDREN(gate, experts, shared_expert, shared_expert_gate)
  SHARDWISE_SAVED(probabilities_, weights_, routing_, outputs_, shared_output_, shared_scale_)
  static_assert(std::is_same_v<typename decltype(gate)::output_layout, Replicate>,
                "shardwise::models::MoeFeedForward: the router (\"gate\") must be replicated over tp; leave it out "
                "of the plan");

  /// The router is drawn from seed + 1, expert e from seed + 10 * (e + 1), the shared expert's gate from seed + 2
  /// and the shared expert from seed + 5.
  MoeFeedForward(MoeConfig const& c, init seed)
      : gate(linear_shape{(c.check(), c.dim), c.experts, false}, seed + 1), config_(c) {
    experts.reserve(c.experts);
    for (std::size_t e = 0; e < c.experts; ++e) experts.emplace_back(c.expert_config(), seed + 10 * (e + 1));
    if (c.shared_expert_hidden == 0) return;
    shared_expert.emplace(c.shared_expert_config(), seed + 5);
    shared_expert_gate.emplace(linear_shape{c.dim, 1, false}, seed + 2);
  }

  /// Forward: each token's top_k experts, their outputs weighted by its probabilities for them.
  template <class X>
  Activation<T, Replicate> forward(X const& x) {
    nn::matrix<T> const& rows = local_rows(x);
    route(gate(x).local);
    Activation<T, Replicate> y{nn::matrix<T>::Zero(rows.rows(), rows.cols())};
    outputs_.assign(experts.size(), {});
    for (std::size_t e = 0; e < experts.size(); ++e) {
      auto const& mine = routing_.routed[e];
      Activation<T, Replicate> in{nn::matrix<T>(static_cast<Eigen::Index>(mine.size()), rows.cols())};
      for (std::size_t i = 0; i < mine.size(); ++i)
        in.local.row(static_cast<Eigen::Index>(i)) = rows.row(mine[i].first);
      outputs_[e] = shardwise::forward(experts[e], in).local;
      for (std::size_t i = 0; i < mine.size(); ++i)
        y.local.row(mine[i].first) += weight(mine[i]) * outputs_[e].row(static_cast<Eigen::Index>(i));
    }
    if (shared_expert) {  // + sigmoid(shared_expert_gate x) * shared_expert(x), token by token
      shared_output_ = shardwise::forward(*shared_expert, x).local;
      shared_scale_ = (*shared_expert_gate)(x).local.unaryExpr([](T v) { return T(1) / (T(1) + std::exp(-v)); });
      y.local += shared_scale_.asDiagonal() * shared_output_;
    }
    return y;
  }

  /// Backward of the last forward: the experts' and the router's parameter gradients (with the load-balancing
  /// loss's, weighted by router_aux_loss_coef), and the input gradient.
  template <class DY>
  Activation<T, Replicate> backward(DY const& dy) {
    nn::matrix<T> const& grads = local_rows(dy);
    nn::matrix<T> dweights = nn::matrix<T>::Zero(weights_.rows(), weights_.cols());
    nn::matrix<T> dx_experts = nn::matrix<T>::Zero(grads.rows(), grads.cols());
    for (std::size_t e = 0; e < experts.size(); ++e) {
      auto const& mine = routing_.routed[e];
      Activation<T, Replicate> g{nn::matrix<T>(static_cast<Eigen::Index>(mine.size()), grads.cols())};
      for (std::size_t i = 0; i < mine.size(); ++i) {
        auto const [token, slot] = mine[i];
        auto const r = static_cast<Eigen::Index>(i);
        g.local.row(r) = weight(mine[i]) * grads.row(token);
        dweights(token, slot) = grads.row(token).dot(outputs_[e].row(r));
      }
      nn::matrix<T> const dx = shardwise::backward(experts[e], g).local;
      for (std::size_t i = 0; i < mine.size(); ++i)
        dx_experts.row(mine[i].first) += dx.row(static_cast<Eigen::Index>(i));
    }
    Activation<T, Replicate> dx = gate.backward(Activation<T, Replicate>{logits_gradient(dweights)});
    dx.local += dx_experts;
    if (shared_expert) {
      nn::vector<T> const dscale = grads.cwiseProduct(shared_output_).rowwise().sum();  // d loss / d scale, per token
      nn::matrix<T> dlogit = dscale.cwiseProduct(shared_scale_.cwiseProduct((T(1) - shared_scale_.array()).matrix()));
      dx.local +=
          shardwise::backward(*shared_expert, Activation<T, Replicate>{shared_scale_.asDiagonal() * grads}).local;
      dx.local += shared_expert_gate->backward(Activation<T, Replicate>{std::move(dlogit)}).local;
    }
    return dx;
  }

  /// transformers' load-balancing loss of the last forward (load_balancing_loss_func over this block alone):
  /// experts * sum_e (share of the routed slots that went to e) * (mean probability of e). The training loss adds
  /// it times router_aux_loss_coef; backward adds that term's gradient.
  [[nodiscard]] double aux_loss() const {
    double loss = 0;
    auto const n = static_cast<double>(routing_.tokens);
    for (std::size_t e = 0; e < experts.size(); ++e)
      loss += static_cast<double>(routing_.load(e)) / n * static_cast<double>(probabilities_.col(e).sum()) / n;
    return loss * static_cast<double>(experts.size());
  }
  /// Where the last forward sent its tokens.
  [[nodiscard]] moe_routing const& routing() const { return routing_; }
  /// The config it was built from.
  [[nodiscard]] MoeConfig const& config() const { return config_; }

 private:
  template <class X>
  static nn::matrix<T> const& local_rows(X const& x) {
    if constexpr (requires { x.local; })
      return x.local;
    else
      return x;
  }
  [[nodiscard]] T weight(std::pair<std::uint32_t, std::uint32_t> at) const { return weights_(at.first, at.second); }

  /// The router's softmax, each token's top_k (best first; ties to the lower index) and their weights.
  void route(nn::matrix<T> const& logits) {
    auto const tokens = static_cast<std::size_t>(logits.rows()), k = config_.top_k;
    probabilities_.resize(logits.rows(), logits.cols());
    weights_.resize(logits.rows(), static_cast<Eigen::Index>(k));
    routing_ = {tokens, k, std::vector<std::uint32_t>(tokens * k), {}};
    routing_.routed.assign(experts.size(), {});
    std::vector<std::uint32_t> order(experts.size());
    for (Eigen::Index t = 0; t < logits.rows(); ++t) {
      auto p = probabilities_.row(t);
      p = (logits.row(t).array() - logits.row(t).maxCoeff()).exp().matrix();
      p /= p.sum();
      if (!p.allFinite())
        shardwise::raise("shardwise::models::MoeFeedForward at \"", own_style<Plan>::path.view(),
                         "\": the router's probabilities for token ", t,
                         " are not finite (its input or the router's weights hold NaN or infinity); check the "
                         "model's inputs and learning rate");
      std::iota(order.begin(), order.end(), 0u);
      std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                        [&](std::uint32_t a, std::uint32_t b) { return p(a) > p(b) || (p(a) == p(b) && a < b); });
      T total = 0;
      for (std::size_t j = 0; j < k; ++j) total += p(order[j]);
      for (std::size_t j = 0; j < k; ++j) {
        auto const slot = static_cast<Eigen::Index>(j);
        routing_.chosen[static_cast<std::size_t>(t) * k + j] = order[j];
        weights_(t, slot) = config_.normalize_top_k ? p(order[j]) / total : p(order[j]);
        routing_.routed[order[j]].emplace_back(static_cast<std::uint32_t>(t), static_cast<std::uint32_t>(j));
      }
    }
  }

  /// The router logits' gradient from the weights' (through the top-k renormalisation and the softmax), plus the
  /// load-balancing loss's times router_aux_loss_coef.
  nn::matrix<T> logits_gradient(nn::matrix<T> const& dweights) const {
    auto const k = config_.top_k;
    auto const n = static_cast<T>(routing_.tokens), count = static_cast<T>(experts.size());
    nn::matrix<T> dp = nn::matrix<T>::Zero(probabilities_.rows(), probabilities_.cols());
    for (Eigen::Index t = 0; t < dp.rows(); ++t) {
      T total = 0, spread = 0;  // the chosen probabilities' sum; sum_j dweight_j * weight_j
      for (std::size_t j = 0; j < k; ++j) {
        total += probabilities_(t, routing_.chosen[static_cast<std::size_t>(t) * k + j]);
        spread += dweights(t, static_cast<Eigen::Index>(j)) * weights_(t, static_cast<Eigen::Index>(j));
      }
      for (std::size_t j = 0; j < k; ++j) {
        auto const e = static_cast<Eigen::Index>(routing_.chosen[static_cast<std::size_t>(t) * k + j]);
        T const dw = dweights(t, static_cast<Eigen::Index>(j));
        dp(t, e) = config_.normalize_top_k ? (dw - spread) / total : dw;
      }
    }
    if (config_.router_aux_loss_coef != 0)
      for (std::size_t e = 0; e < experts.size(); ++e)  // d aux / d p(t, e) = experts * share_e / tokens
        dp.col(static_cast<Eigen::Index>(e)).array() +=
            static_cast<T>(config_.router_aux_loss_coef) * count * static_cast<T>(routing_.load(e)) / (n * n);
    nn::matrix<T> dz = probabilities_.cwiseProduct(dp);  // softmax: p * (dp - sum(p * dp))
    dz -= probabilities_.cwiseProduct((dz.rowwise().sum()).replicate(1, dz.cols()));
    return dz;
  }

  MoeConfig config_;
  nn::matrix<T> probabilities_, weights_;  // tokens x experts; tokens x top_k
  moe_routing routing_;
  std::vector<nn::matrix<T>> outputs_;  // per expert: its outputs for its rows, for the weights' gradient
  nn::matrix<T> shared_output_;         // the shared expert's output, tokens x dim
  nn::vector<T> shared_scale_;          // sigmoid of its gate, per token
};

}  // namespace shardwise::models

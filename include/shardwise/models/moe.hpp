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
#include <limits>
#include <numeric>
#include <optional>
#include <ranges>
#include <string>
#include <utility>
#include <vector>

#include "shardwise/models/llama_feed_forward.hpp"
#include "shardwise/models/moe_config.hpp"
#include "shardwise/models/moe_routing.hpp"
#include "shardwise/nn.hpp"
#include "shardwise/nn/experts/expert_dispatch.hpp"
#include "shardwise/nn/experts/expert_parallel.hpp"

namespace shardwise::models {

/// A mixture-of-experts feed-forward in place of a dense one: forward on x [tokens, dim] gives [tokens, dim].
/// Its router is `gate` and its experts `experts.N` (transformers' Mixtral names: gate, experts.N.w1 / w3 / w2);
/// with a shared expert, `shared_expert` and `shared_expert_gate` (Qwen2-MoE's names). StaticExperts (optional):
/// the expert count at compile time.
template <class T, class Plan = serial_plan, std::size_t StaticExperts = dynamic_size>
struct MoeFeedForward {
  Linear<T, layer_at<Plan, "gate">> gate;  ///< The router, dim -> experts, no bias.
  /// The experts (SwiGLU) this rank holds, named by their index among all of them: all, or under
  /// sw::expert_parallelize its rank's contiguous share (experts.first the first one's index).
  layer_slice<LlamaFeedForward<T, subplan<Plan, "experts.*">>> experts;
  std::optional<LlamaFeedForward<T, subplan<Plan, "shared_expert">>> shared_expert;   ///< Qwen2-MoE's, if any.
  std::optional<Linear<T, layer_at<Plan, "shared_expert_gate">>> shared_expert_gate;  ///< Its gate, dim -> 1.
  /// The sigmoid router's balancing bias (DeepSeek-V3's e_score_correction_bias), added to the scores when experts
  /// are chosen and nowhere else; not trained by gradients but by update_routing_bias, and not a parameter (not
  /// in checkpoints). Empty under the softmax router.
  nn::vector<T> score_correction_bias;
  SHARDWISE_CHILDREN(gate, experts, shared_expert, shared_expert_gate)
  SHARDWISE_HOOKS(on_expert_parallel, token_wise)
  SHARDWISE_SAVED(probabilities_, weights_, routing_, outputs_, shared_output_, shared_scale_, dispatch_)
  static constexpr bool shardwise_token_wise = true;  ///< Each token alone (Llama pools the aux loss over cp).

  /// The router is drawn from seed + 1, expert e from seed + 10 * (e + 1), the shared expert's gate from seed + 2
  /// and the shared expert from seed + 5.
  MoeFeedForward(MoeConfig const& c, init seed) : gate(std::get<0>(shapes((c.check(), c))), seed + 1), config_(c) {
    static_assert(unplanned<decltype(gate)>(),
                  "shardwise::models::MoeFeedForward: its router (\"gate\") computes whole on every rank; leave it out "
                  "of the plan");
    static_assert(servable_feed_forward<typename decltype(experts)::value_type, "experts.*">() &&
                      servable_feed_forward<typename decltype(shared_expert)::value_type, "shared_expert">() &&
                      unplanned<typename decltype(shared_expert_gate)::value_type>(),
                  "shardwise::models::MoeFeedForward: its experts take and give replicated rows (the dispatch and "
                  "the combine need them); leave \"experts.*\" and \"shared_expert\" out of the plan, or cut each "
                  "one's w1 and w3 ColwiseParallel<> and its w2 RowwiseParallel<Shard<-1>, Replicate>, with "
                  "PrepareModuleInput<Replicate, Replicate> at the expert itself (expert tensor parallelism, as "
                  "moe_llama_plan<true, true> does); and leave \"shared_expert_gate\" out");
    if (StaticExperts != dynamic_size && c.experts != StaticExperts)
      shardwise::raise("shardwise::models::MoeFeedForward at \"", own_style<Plan>::path.view(), "\": the config has ",
                       c.experts, " experts but the type ", StaticExperts, "; build the type its config describes");
    experts.reserve(c.experts);
    for (std::size_t e = 0; e < c.experts; ++e)
      experts.emplace_back(expert_config(c, c.expert_hidden), seed + 10 * (e + 1));
    if (c.router == moe_router::sigmoid) score_correction_bias.setZero(static_cast<Eigen::Index>(c.experts));
    pending_loads_.assign(c.experts, 0);
    if (c.shared_expert_hidden == 0) return;
    shared_expert.emplace(expert_config(c, c.shared_expert_hidden), seed + 5);
    if (c.shared_expert_gated) shared_expert_gate.emplace(std::get<3>(shapes(c)).each, seed + 2);
  }
  /// A decoder block's: the experts of c.experts() (LlamaConfig::moe, with the model's dim and mlp_bias).
  MoeFeedForward(LlamaConfig const& c, init seed) : MoeFeedForward(c.experts(), seed) {}

  /// The shapes of its children (the router, the experts, the shared expert and its gate), which the constructor
  /// builds them from and sw::parameter_costs walks.
  static constexpr auto shapes(MoeConfig const& c) {
    bool const shared = c.shared_expert_hidden != 0;
    return std::tuple{linear_shape{c.dim, c.experts, false},
                      repeated_shape{c.experts, Expert::shardwise_shapes(expert_config(c, c.expert_hidden))},
                      only_if(shared, Expert::shardwise_shapes(expert_config(c, c.shared_expert_hidden))),
                      only_if(shared && c.shared_expert_gated, linear_shape{c.dim, 1, false})};
  }
  /// shapes() of a decoder block's experts (LlamaConfig::experts()).
  static constexpr auto shardwise_shapes(LlamaConfig const& c, std::size_t = 0) { return shapes(c.experts()); }

  /// Whether StaticExperts (when given) divide over Ranks ep ranks: sw::expert_parallelize over a mesh of static
  /// size asks, and a compile error names the block's path when they do not.
  template <std::size_t Ranks>
  static constexpr bool shardwise_experts_divide() {
    constexpr bool divides = StaticExperts == dynamic_size || StaticExperts % Ranks == 0;
    if constexpr (!divides) {
      using shown [[maybe_unused]] =
          decltype(shardwise::detail::show_incomplete<shardwise::detail::static_experts_do_not_divide_over_ep_ranks<
                       StaticExperts, Ranks, own_style<Plan>::path>>());
    }
    return divides;
  }

  /// Called by sw::expert_parallelize: from then on this rank holds only its share of the experts, and each forward
  /// and backward sends the rows routed to the others' experts to their ranks and back.
  void shardwise_on_expert_parallel(std::shared_ptr<expert_parallel const> const& placed) {
    std::size_t const per = placed->experts_per_rank(config_.experts, own_style<Plan>::path.view());
    std::size_t const first = per * static_cast<std::size_t>(placed->rank());
    if (experts.first != 0 || experts.size() != config_.experts)
      shardwise::raise("shardwise::expert_parallelize: the experts at \"", own_style<Plan>::path.view(),
                       "\" are placed already; place a model's experts once");
    experts.erase(experts.begin() + static_cast<std::ptrdiff_t>(first + per), experts.end());
    experts.erase(experts.begin(), experts.begin() + static_cast<std::ptrdiff_t>(first));
    experts.first = first;
    for (auto& expert : experts) placed->place(expert);
    placed_ = placed;
  }

  /// The rows this rank's experts computed in the last forward, which their saved activations hold until its
  /// backward (each row's input, and its expert's three hidden products): this rank's routed rows, or with the
  /// experts placed every ep rank's rows for this rank's experts — at worst (every token of every rank routed
  /// here) ep size x tokens x top_k.
  [[nodiscard]] std::size_t expert_rows() const {
    if (placed_) return dispatch_.arrived_rows();
    std::size_t rows = 0;
    for (std::size_t e = 0; e < config_.experts; ++e) rows += routing_.computed(e);
    return rows;
  }

  /// Whether expert `e` (its index among all the module's experts) is held here: every one until
  /// sw::expert_parallelize places them, then this ep rank's share.
  [[nodiscard]] bool holds_expert(std::size_t e) const {
    return e >= experts.first && e < experts.first + experts.size();
  }

  /// Forward: each token's top_k experts, their outputs weighted by its probabilities for them.
  template <class X>
  Activation<T, Replicate> forward(X const& x) {
    nn::matrix<T> const& rows = local_rows(x);
    route(gate(x).local);
    nn::matrix<T> routed(static_cast<Eigen::Index>(routed_rows()), rows.cols());  // each expert's rows in turn
    for_each_routed([&](auto at, Eigen::Index r) { routed.row(r) = rows.row(at.first); });
    outputs_ = compute_experts(routed, true);
    Activation<T, Replicate> y{nn::matrix<T>::Zero(rows.rows(), rows.cols())};
    for_each_routed([&](auto at, Eigen::Index r) { y.local.row(at.first) += weight(at) * outputs_.row(r); });
    if (shared_expert) {  // + sigmoid(shared_expert_gate x) * shared_expert(x), token by token
      shared_output_ = shardwise::forward(*shared_expert, x).local;
      if (shared_expert_gate)
        shared_scale_ = (*shared_expert_gate)(x).local.unaryExpr([](T v) { return sigmoid(v); });
      else
        shared_scale_.setOnes(shared_output_.rows());
      y.local += shared_scale_.asDiagonal() * shared_output_;
    }
    return y;
  }

  /// Backward of the last forward: the experts' and the router's parameter gradients (with the load-balancing
  /// loss's, weighted by router_aux_loss_coef), and the input gradient. Under expert parallelism an expert's
  /// gradients sum over the tokens every ep rank sent it.
  template <class DY>
  Activation<T, Replicate> backward(DY const& dy) {
    nn::matrix<T> const& grads = local_rows(dy);
    nn::matrix<T> dweights = nn::matrix<T>::Zero(weights_.rows(), weights_.cols());
    nn::matrix<T> g(outputs_.rows(), grads.cols());
    for_each_routed([&](auto at, Eigen::Index r) {
      g.row(r) = weight(at) * grads.row(at.first);
      dweights(at.first, at.second) = grads.row(at.first).dot(outputs_.row(r));
    });
    nn::matrix<T> const dx_routed = compute_experts(g, false);
    Activation<T, Replicate> dx = gate.backward(Activation<T, Replicate>{logits_gradient(dweights)});
    for_each_routed([&](auto at, Eigen::Index r) { dx.local.row(at.first) += dx_routed.row(r); });
    if (shared_expert) {
      nn::vector<T> const dscale = grads.cwiseProduct(shared_output_).rowwise().sum();  // d loss / d scale, per token
      nn::matrix<T> dlogit = dscale.cwiseProduct(shared_scale_.cwiseProduct((T(1) - shared_scale_.array()).matrix()));
      dx.local +=
          shardwise::backward(*shared_expert, Activation<T, Replicate>{shared_scale_.asDiagonal() * grads}).local;
      if (shared_expert_gate)
        dx.local += shared_expert_gate->backward(Activation<T, Replicate>{std::move(dlogit)}).local;
    }
    for (std::size_t e = 0; e < config_.experts; ++e) pending_loads_[e] += routing_.load(e);
    return dx;
  }

  /// transformers' load-balancing loss of the last forward (load_balancing_loss_func over this block alone):
  /// experts * sum_e (share of the routed slots that went to e) * (mean probability of e). The training loss adds
  /// it times router_aux_loss_coef; backward adds that term's gradient.
  [[nodiscard]] double aux_loss() const {
    double loss = 0;
    for (std::size_t e = 0; e < balance_.loads.size(); ++e)
      loss += static_cast<double>(balance_.loads[e]) * balance_.score_sums[e];
    auto const tokens = static_cast<double>(balance_.tokens);
    return tokens == 0 ? 0.0 : loss / (tokens * tokens) * static_cast<double>(config_.experts);
  }
  /// Where the last forward sent its tokens (dropped with its activations: sw::drop_saved_activations).
  [[nodiscard]] moe_routing const& routing() const { return routing_; }
  /// What the load-balancing loss counts of the last forward, kept when its activations are dropped.
  [[nodiscard]] moe_balance const& balance() const { return balance_; }
  /// The mean of each expert's scores over the last forward's tokens (the load-balancing loss's probabilities).
  [[nodiscard]] std::vector<double> mean_scores() const {
    std::vector<double> mean(balance_.score_sums);
    for (double& m : mean) m /= static_cast<double>(balance_.tokens);
    return mean;
  }
  /// Set by models::load_balancing_loss for a model of several blocks: each expert's share of all their slots
  /// per row, and their rows, which this block's backward then differentiates the loss with instead of its own,
  /// its gradient times `scale` (besides router_aux_loss_coef). From then on its forward no longer sets its own (a
  /// forward run again for activation checkpointing keeps the pooled loads); each load_balancing_loss sets them anew.
  void use_pooled_loads(std::vector<double> share, double rows, double scale = 1) {
    balance_share_ = std::move(share);
    balance_rows_ = rows;
    balance_scale_ = scale;
    pooled_ = true;
  }
  /// The config it was built from.
  [[nodiscard]] MoeConfig const& config() const { return config_; }

  /// DeepSeek-V3's auxiliary-loss-free balancing, once per step: each expert's bias moves by `rate` towards
  /// balance (down if it took more than the mean load, up if less), from the loads of the tokens trained since the
  /// last update (counted at backward, so a recomputed forward counts once; under sw::expert_parallelize, over every
  /// ep rank's tokens); then those counts start again.
  void update_routing_bias(T rate) {
    if (config_.router != moe_router::sigmoid)
      shardwise::raise("shardwise::models::MoeFeedForward at \"", own_style<Plan>::path.view(),
                       "\": update_routing_bias needs the sigmoid router (MoeConfig::router), whose choice the bias "
                       "steers; the softmax router balances with router_aux_loss_coef");
    nn::vector<double> loads(static_cast<Eigen::Index>(pending_loads_.size()));
    for (std::size_t e = 0; e < pending_loads_.size(); ++e)
      loads(static_cast<Eigen::Index>(e)) = static_cast<double>(pending_loads_[e]);
    if (placed_) placed_->sum(loads);  // every ep (data-parallel) rank's tokens: the bias stays one value
    double const mean = loads.mean();
    for (Eigen::Index e = 0; e < loads.size(); ++e) {
      double const load = loads(e);
      score_correction_bias(e) += rate * T((mean > load) - (mean < load));
    }
    std::fill(pending_loads_.begin(), pending_loads_.end(), std::size_t{0});
  }
  /// The loads update_routing_bias will read: slots routed to each expert by the tokens trained since the last.
  [[nodiscard]] std::vector<std::size_t> const& pending_loads() const { return pending_loads_; }

 private:
  template <class X>
  static nn::matrix<T> const& local_rows(X const& x) {
    if constexpr (requires { x.local; })
      return x.local;
    else
      return x;
  }
  [[nodiscard]] T weight(std::pair<std::uint32_t, std::uint32_t> at) const { return weights_(at.first, at.second); }

  using Expert = LlamaFeedForward<T, subplan<Plan, "experts.*">>;

  /// The (token, slot) pairs every expert computes, expert after expert: fn(pair, its row among them).
  template <class Fn>
  void for_each_routed(Fn&& fn) const {
    Eigen::Index r = 0;
    for (auto const& mine : routing_.routed)
      for (auto const& at : mine) fn(at, r++);
  }
  [[nodiscard]] std::size_t routed_rows() const {
    std::size_t n = 0;
    for (auto const& mine : routing_.routed) n += mine.size();
    return n;
  }

  /// The experts' outputs (forward) or input gradients (backward) for `routed`, each expert's rows in turn (as
  /// for_each_routed orders them): here, or under expert parallelism on the experts' ranks (sw::expert_dispatch).
  nn::matrix<T> compute_experts(nn::matrix<T> const& routed, bool forward) {
    std::vector<std::size_t> rows_of(config_.experts);
    for (std::size_t e = 0; e < rows_of.size(); ++e) rows_of[e] = routing_.routed[e].size();
    if (!placed_) return run_local(routed, [&](std::size_t e) { return rows_of[e]; }, forward);
    auto const compute = [&](std::size_t l, nn::matrix<T> rows) {
      Activation<T, Replicate> in{std::move(rows)};
      return forward ? shardwise::forward(experts[l], in).local : shardwise::backward(experts[l], in).local;
    };
    return dispatch_.run(*placed_, routed, rows_of, experts.size(), forward, unroutable_, compute,
                         [&](Eigen::Index t, int rank) { refuse_unroutable(t, rank); });
  }

  /// Each local expert's forward (or backward) on its block of `rows`: rows_of(l) rows for local expert l, in turn.
  template <class RowsOf>
  nn::matrix<T> run_local(nn::matrix<T> const& rows, RowsOf&& rows_of, bool forward) {
    nn::matrix<T> out(rows.rows(), rows.cols());
    Eigen::Index at = 0;
    for (std::size_t l = 0; l < experts.size(); ++l) {
      auto const count = static_cast<Eigen::Index>(rows_of(l));
      Activation<T, Replicate> in{rows.middleRows(at, count)};
      out.middleRows(at, count) =
          forward ? shardwise::forward(experts[l], in).local : shardwise::backward(experts[l], in).local;
      at += count;
    }
    return out;
  }

  /// The config an expert (or the shared expert) of inner width `hidden` is built from.
  static constexpr LlamaConfig expert_config(MoeConfig const& c, std::size_t hidden) {
    LlamaConfig e;
    e.dim = c.dim, e.hidden = hidden, e.mlp_bias = c.mlp_bias;
    return e;
  }

  /// Whether a Linear of the block has no style (NoParallel).
  template <class Layer>
  static constexpr bool unplanned() {
    return std::is_same_v<typename Layer::style, NoParallel>;
  }
  /// Whether an expert's SwiGLU (child `Name`) is whole, or cut over tp as a dense feed-forward's with replicated
  /// rows in and out: its entry then sums its input gradient over tp.
  template <class FeedForward, fixed_string Name>
  static constexpr bool servable_feed_forward() {
    using W1 = typename decltype(FeedForward::w1)::style;
    using W3 = typename decltype(FeedForward::w3)::style;
    using W2 = typename decltype(FeedForward::w2)::style;
    constexpr bool whole =
        std::is_same_v<W1, NoParallel> && std::is_same_v<W3, NoParallel> && std::is_same_v<W2, NoParallel>;
    constexpr bool cut =
        std::is_same_v<typename layer_at<Plan, Name>::style, PrepareModuleInput<Replicate, Replicate>> &&
        std::is_same_v<W1, ColwiseParallel<Replicate, Shard<-1>>> &&
        std::is_same_v<W3, ColwiseParallel<Replicate, Shard<-1>>> &&
        std::is_same_v<W2, RowwiseParallel<Shard<-1>, Replicate>>;
    return whole || cut;
  }

  static T sigmoid(T v) { return T(1) / (T(1) + std::exp(-v)); }
  [[nodiscard]] bool sigmoid_router() const { return config_.router == moe_router::sigmoid; }
  /// What the chosen scores' sum gets before it divides them (transformers' DeepSeek-V3 adds 1e-20).
  [[nodiscard]] T sum_guard() const { return sigmoid_router() ? T(1e-20) : T(0); }

  /// The router's scores, each token's top_k (best first; ties to the lower index) and their weights.
  void route(nn::matrix<T> const& logits) {
    auto const tokens = static_cast<std::size_t>(logits.rows()), k = config_.top_k;
    probabilities_.resize(logits.rows(), logits.cols());
    weights_.resize(logits.rows(), static_cast<Eigen::Index>(k));
    std::size_t const count = config_.experts;
    routing_ = {tokens, k, std::vector<std::uint32_t>(tokens * k), decltype(routing_.routed)(count),
                std::vector<std::size_t>(count, 0)};
    std::vector<std::uint32_t> order(count);
    std::vector<T> choice(count);
    unroutable_ = -1;
    for (Eigen::Index t = 0; t < logits.rows(); ++t) {
      if (!score(t, logits)) {  // alone: refused here; placed: by every ep rank at the counts' exchange
        if (!placed_) refuse_unroutable(t, -1);
        unroutable_ = t;
        for (auto& mine : routing_.routed) mine.clear();
        break;
      }
      choose(t, choice, order);
      auto const p = probabilities_.row(t);
      T total = sum_guard();
      for (std::size_t j = 0; j < k; ++j) total += p(order[j]);
      T const scale = static_cast<T>(config_.routed_scaling_factor) / (config_.normalize_top_k ? total : T(1));
      for (std::size_t j = 0; j < k; ++j) {
        routing_.chosen[static_cast<std::size_t>(t) * k + j] = order[j];
        weights_(t, static_cast<Eigen::Index>(j)) = p(order[j]) * scale;
        routing_.routed[order[j]].emplace_back(static_cast<std::uint32_t>(t), static_cast<std::uint32_t>(j));
        ++routing_.demand[order[j]];
      }
    }
    if (config_.capacity_factor > 0) drop_beyond_capacity();
    balance_ = {tokens, routing_.demand, std::vector<double>(count)};
    for (std::size_t e = 0; e < count; ++e)
      balance_.score_sums[e] =  // no tokens: no column to take (an empty matrix's column is a null pointer's)
          tokens == 0 ? 0.0 : static_cast<double>(probabilities_.col(static_cast<Eigen::Index>(e)).sum());
    if (pooled_) return;  // the loads of the model's blocks together (use_pooled_loads)
    balance_share_.resize(count);
    for (std::size_t e = 0; e < count; ++e)
      balance_share_[e] = tokens == 0 ? 0.0 : static_cast<double>(routing_.load(e)) / static_cast<double>(tokens);
    balance_rows_ = static_cast<double>(tokens);
  }

  /// Each expert keeps at most its capacity of its (token, slot) pairs, by the drop policy, in token order.
  void drop_beyond_capacity() {
    auto const capacity = static_cast<std::size_t>(std::ceil(
        config_.capacity_factor * static_cast<double>(routing_.tokens * routing_.top_k) / double(config_.experts)));
    for (auto& mine : routing_.routed) {
      if (mine.size() <= capacity) continue;
      if (config_.drop_policy == moe_drop_policy::probs)  // the highest weights first; ties to the earlier token
        std::stable_sort(mine.begin(), mine.end(), [&](auto const& a, auto const& b) { return weight(a) > weight(b); });
      mine.resize(capacity);
      std::sort(mine.begin(), mine.end());
    }
  }

  /// Token t's scores: the softmax of its logits, or each expert's sigmoid; whether they are finite.
  [[nodiscard]] bool score(Eigen::Index t, nn::matrix<T> const& logits) {
    auto p = probabilities_.row(t);
    if (sigmoid_router()) {
      p = logits.row(t).unaryExpr([](T v) { return sigmoid(v); });
    } else {
      p = (logits.row(t).array() - logits.row(t).maxCoeff()).exp().matrix();
      p /= p.sum();
    }
    return p.allFinite();
  }
  /// Raises for token t (of ep rank `rank`, if placed) whose router's probabilities are not finite.
  [[noreturn]] void refuse_unroutable(Eigen::Index t, int rank) const {
    shardwise::raise("shardwise::models::MoeFeedForward at \"", own_style<Plan>::path.view(),
                     "\": the router's probabilities for token ", t, rank < 0 ? "" : " of ep rank ",
                     rank < 0 ? std::string() : std::to_string(rank),
                     " are not finite (its input or the router's weights hold NaN or infinity); check the "
                     "model's inputs and learning rate");
  }

  /// Token t's top_k experts in `order`'s first places, best first: by score (plus the correction bias under the
  /// sigmoid router), among the experts of its top_groups best groups when the experts are grouped. `choice`:
  /// room for the experts' choice scores.
  void choose(Eigen::Index t, std::vector<T>& choice, std::vector<std::uint32_t>& order) const {
    for (std::size_t e = 0; e < choice.size(); ++e)
      choice[e] = probabilities_(t, static_cast<Eigen::Index>(e)) +
                  (sigmoid_router() ? score_correction_bias(static_cast<Eigen::Index>(e)) : T(0));
    if (config_.groups > 1) keep_best_groups(choice);
    auto const best = [&](std::uint32_t a, std::uint32_t b) {
      return choice[a] > choice[b] || (choice[a] == choice[b] && a < b);
    };
    std::iota(order.begin(), order.end(), 0u);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(config_.top_k), order.end(), best);
  }

  /// DeepSeek-V3's group limit: a group's score is the sum of its two best choice scores; the experts outside the
  /// top_groups best groups (ties to the lower group) cannot be chosen.
  void keep_best_groups(std::vector<T>& choice) const {
    std::size_t const per = config_.experts / config_.groups;
    std::vector<T> group_score(config_.groups);
    for (std::size_t g = 0; g < config_.groups; ++g) {
      T first = -std::numeric_limits<T>::infinity(), second = first;  // the group's two best
      for (std::size_t e = g * per; e < (g + 1) * per; ++e)
        if (choice[e] > first)
          second = std::exchange(first, choice[e]);
        else if (choice[e] > second)
          second = choice[e];
      group_score[g] = first + second;
    }
    std::vector<std::uint32_t> groups(config_.groups);
    std::iota(groups.begin(), groups.end(), 0u);
    std::partial_sort(groups.begin(), groups.begin() + static_cast<std::ptrdiff_t>(config_.top_groups), groups.end(),
                      [&](std::uint32_t a, std::uint32_t b) {
                        return group_score[a] > group_score[b] || (group_score[a] == group_score[b] && a < b);
                      });
    std::vector<bool> kept(config_.groups, false);
    for (std::size_t g = 0; g < config_.top_groups; ++g) kept[groups[g]] = true;
    for (std::size_t e = 0; e < choice.size(); ++e)
      if (!kept[e / per]) choice[e] = -std::numeric_limits<T>::infinity();
  }

  /// The router logits' gradient from the weights' (through the top-k renormalisation and the softmax or the
  /// sigmoids), plus the load-balancing loss's times router_aux_loss_coef.
  nn::matrix<T> logits_gradient(nn::matrix<T> const& dweights) const {
    nn::matrix<T> dp = scores_gradient(dweights);
    if (config_.router_aux_loss_coef != 0 && dp.rows() > 0) {  // d aux / d p(t, e) = experts * share_e / rows
      auto const count = static_cast<T>(config_.experts);
      for (std::size_t e = 0; e < config_.experts; ++e)
        dp.col(static_cast<Eigen::Index>(e)).array() += static_cast<T>(config_.router_aux_loss_coef * balance_scale_) *
                                                        count * static_cast<T>(balance_share_[e] / balance_rows_);
    }
    if (sigmoid_router())  // each score its own sigmoid
      return dp.cwiseProduct(probabilities_.cwiseProduct((T(1) - probabilities_.array()).matrix()));
    nn::matrix<T> dz = probabilities_.cwiseProduct(dp);  // softmax: p * (dp - sum(p * dp))
    dz -= probabilities_.cwiseProduct((dz.rowwise().sum()).replicate(1, dz.cols()));
    return dz;
  }

  /// The scores' gradient from the weights': w_j = r p_j / S with S the chosen scores' sum (renormalised), else
  /// w_j = r p_j; so dp_k = (r / S) (dw_k - sum_j dw_j w_j / r), else r dw_k.
  nn::matrix<T> scores_gradient(nn::matrix<T> const& dweights) const {
    auto const k = config_.top_k;
    T const r = static_cast<T>(config_.routed_scaling_factor);
    nn::matrix<T> dp = nn::matrix<T>::Zero(probabilities_.rows(), probabilities_.cols());
    for (Eigen::Index t = 0; t < dp.rows(); ++t) {
      T total = sum_guard(), spread = 0;
      for (std::size_t j = 0; j < k; ++j) {
        total += probabilities_(t, routing_.chosen[static_cast<std::size_t>(t) * k + j]);
        spread += dweights(t, static_cast<Eigen::Index>(j)) * weights_(t, static_cast<Eigen::Index>(j)) / r;
      }
      for (std::size_t j = 0; j < k; ++j) {
        auto const e = static_cast<Eigen::Index>(routing_.chosen[static_cast<std::size_t>(t) * k + j]);
        T const dw = dweights(t, static_cast<Eigen::Index>(j));
        dp(t, e) = config_.normalize_top_k ? r / total * (dw - spread) : r * dw;
      }
    }
    return dp;
  }

  MoeConfig config_;
  nn::matrix<T> probabilities_, weights_;  // tokens x experts; tokens x top_k
  moe_routing routing_;
  moe_balance balance_;    // what the load-balancing loss counts: kept when the activations are dropped
  nn::matrix<T> outputs_;  // the experts' outputs, their rows in turn (for_each_routed), for the weights' gradient
  expert_dispatch<T> dispatch_;  // under ep: the exchange of the last forward (its counts), for its backward
  std::shared_ptr<expert_parallel const> placed_;  // set by sw::expert_parallelize
  Eigen::Index unroutable_ = -1;                   // the first token of the last forward with no finite scores
  nn::matrix<T> shared_output_;                    // the shared expert's output, tokens x dim
  nn::vector<T> shared_scale_;                     // sigmoid of its gate, per token (ones without a gate)
  std::vector<std::size_t> pending_loads_;         // slots per expert trained since update_routing_bias
  std::vector<double> balance_share_;  // per expert, slots per row the loss's gradient counts: own or pooled
  double balance_rows_ = 0;            // the rows they were counted over
  double balance_scale_ = 1;           // the pooled loss's gradient's scale (1/microbatches, accumulating)
  bool pooled_ = false;                // whether they are pooled over a model's blocks (use_pooled_loads)
};

}  // namespace shardwise::models

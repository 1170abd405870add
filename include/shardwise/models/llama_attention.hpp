#pragma once
// The Llama model's attention: causal grouped-query attention with rotary embeddings (Hugging Face's rotate-half
// convention), forward and backward for training, and a forward with a key-value cache for generation. Under
// ColwiseParallel on wq, wk and wv each rank computes its heads' share; more tp ranks than key-value heads repeat
// them (kv_size_multiplier).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "shardwise/context/context_parallel.hpp"
#include "shardwise/context/cost.hpp"
#include "shardwise/inference/cached_attention.hpp"
#include "shardwise/models/grouped_heads.hpp"
#include "shardwise/models/llama_config.hpp"
#include "shardwise/nn.hpp"

namespace shardwise::models {

/// Causal grouped-query attention with rotary embeddings. Under ColwiseParallel on wq, wk and wv each rank
/// computes heads / tp query heads and kv_heads / tp key-value heads, the groups intact; with more ranks than
/// key-value heads, each key-value head is repeated (kv_size_multiplier) and the copies' gradients summed.
/// StaticHeads / StaticKvHeads (optional): head counts known at compile time, checked against a static tp size.
template <class T, class Plan = serial_plan, std::size_t StaticHeads = dynamic_size,
          std::size_t StaticKvHeads = dynamic_size>
struct LlamaAttention {
  Linear<T, style_at<Plan, "wq">> wq;  ///< Query projection, dim -> heads * head_dim, no bias.
  Linear<T, style_at<Plan, "wk">> wk;  ///< Key projection, dim -> kv_heads * head_dim, no bias.
  Linear<T, style_at<Plan, "wv">> wv;  ///< Value projection, dim -> kv_heads * head_dim, no bias.
  Linear<T, style_at<Plan, "wo">> wo;  ///< Output projection, heads * head_dim -> dim, no bias.
  SHARDWISE_CHILDREN(wq, wk, wv, wo)
  SHARDWISE_HOOKS(static_check, on_parallelize, on_context_parallel)
  SHARDWISE_SAVED(q_, k_, v_, saved_, out_)

  /// The projections' parameters are drawn from seed + 1 .. seed + 4; throws if the config's head counts differ
  /// from StaticHeads / StaticKvHeads.
  LlamaAttention(LlamaConfig const& c, std::uint64_t seed) : LlamaAttention(c, seed, shardwise_shapes(c)) {}

  /// Whether the plan shards the heads (wk's weight cut by output rows: ColwiseParallel or a style like it).
  static constexpr bool sharded_heads =
      std::is_same_v<typename Linear<T, style_at<Plan, "wk">>::weight_grad_placement, Shard<0>>;

  /// The shapes of wq, wk, wv and wo.
  using shape_list = std::tuple<linear_shape, linear_shape, linear_shape, linear_shape>;
  /// The shapes of wq, wk, wv and wo, which the constructor builds them from and sw::parameter_costs walks; at
  /// `tp` ranks wk and wv hold the key-value copies parallelize makes (kv_size_multiplier); tp 0: as built.
  static constexpr shape_list shardwise_shapes(LlamaConfig const& c, std::size_t tp = 0) {
    std::size_t const copies =
        sharded_heads ? grouped_heads::of(c).kv_copies(tp, "shardwise::models::Llama", own_style<Plan>::path.view())
                      : 1;
    std::size_t const q = c.heads * c.head_dim(), kv = c.kv_heads * c.head_dim();
    return {linear_shape{c.dim, q, false}, linear_shape{c.dim, kv, false, copies},
            linear_shape{c.dim, kv, false, copies}, linear_shape{q, c.dim, false}};
  }

 private:
  LlamaAttention(LlamaConfig const& c, std::uint64_t seed, shape_list const& sh)
      : wq(std::get<0>(sh), seed + 1),
        wk(std::get<1>(sh), seed + 2),
        wv(std::get<2>(sh), seed + 3),
        wo(std::get<3>(sh), seed + 4),
        config_(c),
        rope_(c.sequence, c.head_dim(), c.rope_theta) {
    grouped_heads::of(c).require_declared<StaticHeads, StaticKvHeads>("shardwise::models::LlamaAttention",
                                                                      own_style<Plan>::path.view());
  }

 public:
  /// Called by sw::parallelize when the tp size is static: the head counts must be servable.
  template <std::size_t Ranks>
  static constexpr bool shardwise_static_check() {
    return !sharded_heads || static_heads_servable<own_style<Plan>::path, StaticHeads, StaticKvHeads, Ranks>();
  }

  /// Called by sw::parallelize before any layer is cut: with more ranks than key-value heads, wk and wv repeat
  /// each key-value head kv_size_multiplier times, so that every rank holds the one its query heads use.
  void shardwise_on_parallelize(int tp) {
    if constexpr (sharded_heads)
      grouped_heads::of(config_).repeat_kv_heads(wk, wv, tp, "shardwise::models::Llama", own_style<Plan>::path.view());
  }

  /// Its cost on one rank (sw::cost) for a config and s.tokens tokens: sw::attention_cost of its four
  /// projections; wk and wv hold kv_size_multiplier copies of each key-value head where tp needs them.
  static constexpr cost shardwise_cost(LlamaConfig const& c, cost_inputs const& s) {
    std::size_t const copies = std::get<1>(shardwise_shapes(c, s.tp)).copies;
    std::size_t const q = c.heads * c.head_dim(), kv = c.kv_heads * copies * c.head_dim();
    return attention_cost<T>(decltype(wq)::shardwise_cost(c.dim, q, s), decltype(wk)::shardwise_cost(c.dim, kv, s),
                             decltype(wv)::shardwise_cost(c.dim, kv, s), decltype(wo)::shardwise_cost(q, c.dim, s),
                             {q, kv, c.heads, c.head_dim(), c.sequence, sharded_heads ? s.tp : 1}, s);
  }

  /// Called by sw::context_parallelize: from then on its rows are this rank's tokens of each sequence, rotated at
  /// their global positions and attended across the cp ranks.
  void shardwise_on_context_parallel(std::shared_ptr<context_parallel const> const& context) { context_ = context; }

  /// Forward on x [tokens, dim]; keeps what backward needs.
  template <class X>
  auto forward(X const& x) {
    q_ = wq(x), k_ = wk(x), v_ = wv(x);
    rotate_heads(q_.local, false);
    rotate_heads(k_.local, false);
    auto out = same_shape(q_);
    attend_causal<T>(context_.get(), q_.local, k_.local, v_.local, config_.sequence, config_.head_dim(), out.local,
                     saved_, out_);
    return wo(std::move(out));  // its storage becomes wo's kept input
  }
  /// Forward with a key-value cache (inference): the step's new rows, RoPE at their positions, attention over
  /// each sequence's cached tokens (nn::cached_attention, which writes this layer's keys and values into `cache`).
  /// Keeps nothing of its own for backward.
  template <class X>
  auto forward(X const& x, cache_step const& step, nn::kv_layer<T>& cache) {
    auto q = wq(x), k = wk(x), v = wv(x);
    rotate_heads_at(q.local, step), rotate_heads_at(k.local, step);
    auto out = same_shape(q);
    nn::cached_attention<T>(q.local, k.local, v.local, config_.head_dim(), step, cache, out.local);
    return wo(std::move(out));
  }

  /// Key (and value) columns on this rank: its key-value heads x head_dim, copies included (after parallelize).
  [[nodiscard]] std::size_t kv_columns() const { return static_cast<std::size_t>(wk.weight.rows()); }

  /// Backward of the last forward: accumulates the parameter gradients and returns the input gradient.
  template <class DY>
  auto backward(DY const& dy) {
    auto dout = wo.backward(dy);
    auto dq = same_shape(q_), dk = same_shape(k_), dv = same_shape(v_);  // all written by the backward
    attend_causal_backward<T>(context_.get(), dout.local, q_.local, k_.local, v_.local, out_, saved_, dq.local,
                              dk.local, dv.local);
    rotate_heads(dq.local, true);  // the transpose of the forward rotation
    rotate_heads(dk.local, true);
    return wq.backward(dq) + wk.backward(dk) + wv.backward(dv);  // Partial<Sum> under ColwiseParallel: one reduction
  }

 private:
  /// An activation of a's layout and shape, its values not set: for outputs a kernel writes in full.
  template <class A>
  static A same_shape(A const& a) {
    return A{nn::matrix<T>(a.local.rows(), a.local.cols())};
  }

  /// Rotary embedding on every head of [tokens, heads * head_dim] (inverse: its transpose, for backward); under
  /// context parallelism, each row at its token's global position.
  void rotate_heads(nn::matrix<T>& x, bool inverse) const {
    auto const d = static_cast<Eigen::Index>(config_.head_dim());
    if (context_) return rotate_heads_at_positions(x, inverse);
    for (Eigen::Index h = 0; h < x.cols() / d; ++h)
      detail::apply_rope(x.middleCols(h * d, d), rope_, config_.sequence, inverse);
  }
  /// Each sequence's rows are this rank's positions: rotated a run of consecutive positions at a time.
  void rotate_heads_at_positions(nn::matrix<T>& x, bool inverse) const {
    auto const d = static_cast<Eigen::Index>(config_.head_dim());
    auto const& positions = context_->positions();
    auto const n = static_cast<Eigen::Index>(positions.size());
    Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> scratch;
    for (Eigen::Index first = 0; first < n;) {
      Eigen::Index run = 1;
      while (first + run < n &&
             positions[static_cast<std::size_t>(first + run)] == positions[static_cast<std::size_t>(first)] + run)
        ++run;
      for (Eigen::Index b = 0; b < x.rows(); b += n)
        for (Eigen::Index h = 0; h < x.cols() / d; ++h)
          detail::rotate_rows(x.block(b + first, h * d, run, d), rope_, positions[static_cast<std::size_t>(first)],
                              inverse, scratch);
      first += run;
    }
  }

  /// Rotary embedding on every head of the step's rows, each entry's at its own positions; the tables grow to the
  /// cache's capacity (once) when it is longer than config().sequence.
  void rotate_heads_at(nn::matrix<T>& x, cache_step const& step) {
    if (static_cast<std::size_t>(rope_.cos.rows()) < step.capacity)
      rope_ = detail::rope_tables<T>(step.capacity, config_.head_dim(), config_.rope_theta);
    auto const d = static_cast<Eigen::Index>(config_.head_dim());
    Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> scratch;
    Eigen::Index row = 0;
    for (auto const& e : step.entries) {
      auto const n = static_cast<Eigen::Index>(e.count);
      for (Eigen::Index h = 0; h < x.cols() / d; ++h)
        detail::rotate_rows(x.block(row, h * d, n, d), rope_, static_cast<Eigen::Index>(e.start), false, scratch);
      row += n;
    }
  }

  LlamaConfig config_;
  detail::rope_tables<T> rope_;
  output_t<decltype(wq)> q_;
  output_t<decltype(wk)> k_, v_;
  nn::attention_saved<T> saved_;                     // each query row's softmax logsumexp, for backward
  std::shared_ptr<context_parallel const> context_;  // set by sw::context_parallelize
  nn::matrix<T> out_;                                // the attention's output, kept under context parallelism
};

}  // namespace shardwise::models

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
#include "shardwise/models/rotary_embedding.hpp"
#include "shardwise/nn.hpp"
#include "shardwise/nn/layers/head_norm.hpp"

namespace shardwise::models {

/// Causal grouped-query attention with rotary embeddings. Under ColwiseParallel on wq, wk and wv each rank
/// computes heads / tp query heads and kv_heads / tp key-value heads, the groups intact; with more ranks than
/// key-value heads, each key-value head is repeated (kv_size_multiplier) and the copies' gradients summed.
/// StaticHeads / StaticKvHeads (optional): head counts known at compile time, checked against a static tp size.
template <class T, class Plan = serial_plan, std::size_t StaticHeads = dynamic_size,
          std::size_t StaticKvHeads = dynamic_size>
struct LlamaAttention {
  Linear<T, layer_at<Plan, "wq">> wq;  ///< Query projection, dim -> heads * head_dim (bias: attention_bias).
  Linear<T, layer_at<Plan, "wk">> wk;  ///< Key projection, dim -> kv_heads * head_dim (bias: attention_bias).
  Linear<T, layer_at<Plan, "wv">> wv;  ///< Value projection, dim -> kv_heads * head_dim (bias: attention_bias).
  Linear<T, layer_at<Plan, "wo">> wo;  ///< Output projection, heads * head_dim -> dim (attention_output_bias).
  /// Per-head RMSNorm on the queries before the rotation (config qk_norm, Qwen3's), cut with wq's heads.
  std::optional<HeadRMSNorm<T, layer_at<Plan, "q_norm">, typename output_t<decltype(wq)>::placement>> q_norm;
  /// The same on the keys, cut with wk's heads.
  std::optional<HeadRMSNorm<T, layer_at<Plan, "k_norm">, typename output_t<decltype(wk)>::placement>> k_norm;
  SHARDWISE_CHILDREN(wq, wk, wv, wo, q_norm, k_norm)
  SHARDWISE_HOOKS(static_check, on_parallelize, on_context_parallel)
  SHARDWISE_SAVED(q_, k_, v_, saved_, rows_)

  /// The projections' parameters are drawn from seed + 1 .. seed + 4; throws if the config's head counts differ
  /// from StaticHeads / StaticKvHeads.
  constexpr LlamaAttention(LlamaConfig const& c, init seed)
      : wq(std::get<0>(shardwise_shapes(c)), seed + 1),
        wk(std::get<1>(shardwise_shapes(c)), seed + 2),
        wv(std::get<2>(shardwise_shapes(c)), seed + 3),
        wo(std::get<3>(shardwise_shapes(c)), seed + 4),
        q_norm(head_norm<decltype(q_norm)>(std::get<4>(shardwise_shapes(c)), c, seed)),
        k_norm(head_norm<decltype(k_norm)>(std::get<5>(shardwise_shapes(c)), c, seed)),
        config_(c),
        rope_(c.sequence, c.head_dim(), c.rope_theta, c.rope_scaling) {
    grouped_heads::of(c).require_declared<StaticHeads, StaticKvHeads>("shardwise::models::LlamaAttention",
                                                                      own_style<Plan>::path.view());
  }

  /// Whether the plan shards the heads (wk's weight cut by output rows: ColwiseParallel or a style like it).
  static constexpr bool sharded_heads =
      std::is_same_v<typename Linear<T, layer_at<Plan, "wk">>::weight_grad_placement, Shard<0>>;

  /// The shapes of wq, wk, wv, wo, q_norm and k_norm (when qk_norm), which the constructor builds them from and
  /// sw::parameter_costs walks; at `tp` ranks wk and wv hold the key-value copies parallelize makes
  /// (kv_size_multiplier); tp 0: as built.
  static constexpr auto shardwise_shapes(LlamaConfig const& c, std::size_t tp = 0) {
    std::size_t const copies =
        sharded_heads ? grouped_heads::of(c).kv_copies(tp, "shardwise::models::Llama", own_style<Plan>::path.view())
                      : 1;
    std::size_t const q = c.heads * c.head_dim(), kv = c.kv_heads * c.head_dim();
    bool const b = c.attention_bias;
    auto const head_norm = only_if(c.qk_norm, norm_shape{c.head_dim()});
    return std::tuple{linear_shape{c.dim, q, b},
                      linear_shape{c.dim, kv, b, copies},
                      linear_shape{c.dim, kv, b, copies},
                      linear_shape{q, c.dim, c.attention_output_bias},
                      head_norm,
                      head_norm};
  }

  /// Called by sw::parallelize when the tp size is static: the head counts must be servable.
  template <std::size_t Ranks>
  static constexpr bool shardwise_static_check() {
    return !sharded_heads || static_heads_servable<own_style<Plan>::path, StaticHeads, StaticKvHeads, Ranks>();
  }

  /// Called by sw::parallelize before any layer is cut: with more ranks than key-value heads, wk and wv repeat
  /// each key-value head kv_size_multiplier times, so that every rank holds the one its query heads use.
  constexpr void shardwise_on_parallelize(int tp) {
    if constexpr (sharded_heads)
      grouped_heads::of(config_).repeat_kv_heads(wk, wv, tp, "shardwise::models::Llama", own_style<Plan>::path.view());
  }

  /// Its cost on one rank (sw::cost) for a config and s.tokens tokens: its own forward and backward, run on
  /// shapes (sw::derived_cost); wk and wv hold kv_size_multiplier copies of each key-value head where tp needs them.
  static constexpr cost shardwise_cost(LlamaConfig const& c, cost_inputs const& s) {
    using input = Activation<meta<T>, typename decltype(wq)::input_layout>;
    return derived_cost<LlamaAttention<meta<T>, Plan, StaticHeads, StaticKvHeads>, input>(s, c.dim, c, 0);
  }

  /// Called by sw::context_parallelize: from then on its rows are this rank's tokens of each sequence, rotated at
  /// their global positions and attended across the cp ranks.
  void shardwise_on_context_parallel(std::shared_ptr<context_parallel const> const& context) { context_ = context; }

  /// Forward on x [tokens, dim], whose rows are the sequences `rows` (each attends within itself, its positions
  /// from 0; empty: whole sequences of config().sequence); keeps what backward needs.
  template <class X>
  constexpr auto forward(X const& x, sequence_lengths const& rows = {}) {
    q_ = normed(q_norm, wq(x)), k_ = normed(k_norm, wk(x)), v_ = wv(x);
    rows_ = rows.empty() ? sequence_lengths::every(config_.sequence) : rows;
    rope_.rotate(q_.local, rows_, context_.get());
    rope_.rotate(k_.local, rows_, context_.get());
    auto out = empty_like(q_);
    attend_causal<T>(context_.get(), q_.local, k_.local, v_.local, rows_, config_.head_dim(), out.local, saved_,
                     config_.sliding_window);
    return wo(std::move(out));  // its storage becomes wo's kept input
  }
  /// Forward with a key-value cache (inference): the step's new rows, RoPE at their positions, attention over
  /// each sequence's cached tokens (nn::cached_attention, which writes this layer's keys and values into `cache`).
  /// Keeps nothing of its own for backward.
  template <class X>
  auto forward(X const& x, cache_step const& step, nn::kv_layer<T>& cache) {
    auto q = normed(q_norm, wq(x)), k = normed(k_norm, wk(x)), v = wv(x);
    rope_.rotate(q.local, step), rope_.rotate(k.local, step);
    auto out = empty_like(q);
    nn::cached_attention<T>(q.local, k.local, v.local, config_.head_dim(), step, cache, out.local,
                            nn::attention_block_rows, config_.sliding_window);
    return wo(std::move(out));
  }

  /// Backward of the last forward: accumulates the parameter gradients and returns the input gradient.
  template <class DY>
  constexpr auto backward(DY const& dy) {
    auto dout = wo.backward(dy);
    auto dq = empty_like(q_), dk = empty_like(k_), dv = empty_like(v_);  // all written by the backward
    attend_causal_backward<T>(context_.get(), dout.local, q_.local, k_.local, v_.local, saved_, dq.local, dk.local,
                              dv.local);
    rope_.rotate(dq.local, rows_, context_.get(), true);  // the transpose of the forward rotation
    rope_.rotate(dk.local, rows_, context_.get(), true);
    return wq.backward(normed_backward(q_norm, std::move(dq))) + wk.backward(normed_backward(k_norm, std::move(dk))) +
           wv.backward(dv);  // Partial<Sum> under ColwiseParallel: one reduction
  }

 private:
  template <class Norm>
  static constexpr Norm head_norm(repeated_shape<norm_shape> const& shape, LlamaConfig const& c, init seed) {
    if (shape.count == 0) return std::nullopt;
    return Norm(std::in_place, shape.each.features, T(c.norm_eps), seed);
  }
  template <class Norm, class A>
  static constexpr A normed(std::optional<Norm>& norm, A a) {
    if (norm) return (*norm)(std::move(a));
    return a;
  }
  template <class Norm, class A>
  static constexpr A normed_backward(std::optional<Norm>& norm, A da) {
    if (norm) return norm->backward(std::move(da));
    return da;
  }

  LlamaConfig config_;
  rotary_embedding<T> rope_;
  output_t<decltype(wq)> q_;
  output_t<decltype(wk)> k_, v_;
  nn::attention_saved<T> saved_;  // each query row's softmax logsumexp (and the output under the ring)
  sequence_lengths rows_;         // the sequences of the last forward's rows
  context_slot<T> context_;       // set by sw::context_parallelize
};

}  // namespace shardwise::models

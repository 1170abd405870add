#pragma once
// A GPT-2-style decoder written against shardwise's public API only, as a user would write it: token
// embedding `wte` plus learned position embedding `wpe`; blocks of LayerNorm -> causal multi-head attention
// (q, k and v as three Linear layers with bias, so ColwiseParallel cuts whole heads) -> residual -> LayerNorm
// -> MLP (dim -> 4 dim, GELU with the tanh approximation, transformers' "gelu_new", -> dim) -> residual; final
// LayerNorm `ln_f`; the LM head tied to `wte`, as GPT-2 always is. Names follow transformers' GPT2LMHeadModel
// without its "transformer." prefix ("h.0.attn.c_proj.weight"), but for q/k/v, which GPT2LMHeadModel fuses
// into c_attn (Conv1D, [in, out]): here q_proj, k_proj and v_proj, each [out, in]. The plan decides how it is
// sharded (models/gpt2_plan.hpp); with sw::serial_plan it is the unsharded reference.
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "shardwise/context/context_parallel.hpp"
#include "shardwise/context/cost.hpp"
#include "shardwise/inference/cached_attention.hpp"
#include "shardwise/nn.hpp"

namespace shardwise::models {

/// The sizes and settings of a GPT-2 model.
struct GPT2Config {
  std::size_t vocabulary = 256;  ///< Token ids are in [0, vocabulary).
  std::size_t dim = 64;          ///< The model (embedding) width; a multiple of heads.
  std::size_t layers = 2;        ///< Number of blocks.
  std::size_t heads = 4;         ///< Attention heads.
  /// Tokens per sequence, and the positions wpe holds (transformers' n_positions).
  std::size_t sequence = 32;
  double layer_norm_eps = 1e-5;  ///< The LayerNorms' epsilon.
  init seed = 1234;              ///< Seed of the initial parameters (sw::Lazy marks it "declared only").
  /// Width of one attention head: dim / heads.
  [[nodiscard]] constexpr std::size_t head_dim() const { return dim / heads; }
  /// The MLP's inner width, 4 * dim (GPT-2's n_inner default).
  [[nodiscard]] constexpr std::size_t hidden() const { return 4 * dim; }
  /// The fields that decide what the weights mean, as text, saved beside them by save_sharded and compared by
  /// load_sharded.
  [[nodiscard]] std::map<std::string, std::string> fields() const {
    return {{"vocabulary", std::to_string(vocabulary)},
            {"dim", std::to_string(dim)},
            {"layers", std::to_string(layers)},
            {"heads", std::to_string(heads)},
            {"layer_norm_eps", shardwise::config_number(layer_norm_eps)}};
  }
  /// Throws, naming the field and the fix, for sizes no model can have: zeros, tables too large to index, a
  /// non-positive epsilon (GPT2 itself refuses a width the heads do not divide).
  constexpr void check() const {
    auto const positive = [](char const* field, std::size_t value) {
      if (value == 0) shardwise::raise("shardwise::models::GPT2Config: ", field, " is 0; give it a positive size");
    };
    positive("vocabulary", vocabulary), positive("dim", dim), positive("heads", heads);
    positive("sequence", sequence);
    constexpr std::size_t limit = std::size_t{1} << 40;  // elements in one table; far beyond any model here
    if (vocabulary > limit / dim || sequence > limit / dim || dim > limit / (4 * dim))
      shardwise::raise("shardwise::models::GPT2Config: vocabulary ", vocabulary, ", sequence ", sequence,
                       " or the MLP's 4 * dim times dim ", dim, " overflows a table; check the sizes");
    if (!(layer_norm_eps > 0))
      shardwise::raise("shardwise::models::GPT2Config: layer_norm_eps ", layer_norm_eps, " must be positive");
  }
};

/// Causal multi-head self-attention with biases. Under ColwiseParallel on q_proj, k_proj and v_proj each rank
/// computes heads / tp whole heads; c_proj (RowwiseParallel) sums the heads' contributions.
template <class T, class Plan = serial_plan>
struct GPT2Attention {
  Linear<T, layer_at<Plan, "q_proj">> q_proj;  ///< Query projection, dim -> dim, with bias.
  Linear<T, layer_at<Plan, "k_proj">> k_proj;  ///< Key projection, dim -> dim, with bias.
  Linear<T, layer_at<Plan, "v_proj">> v_proj;  ///< Value projection, dim -> dim, with bias.
  Linear<T, layer_at<Plan, "c_proj">> c_proj;  ///< Output projection, dim -> dim, with bias.
  SHARDWISE_CHILDREN(q_proj, k_proj, v_proj, c_proj)
  SHARDWISE_HOOKS(on_parallelize, on_context_parallel)
  SHARDWISE_SAVED(q_, k_, v_, saved_)

  /// The projections' parameters are drawn from seed + 1 .. seed + 4.
  constexpr GPT2Attention(GPT2Config const& c, init seed)
      : q_proj(std::get<0>(shardwise_shapes(c)), seed + 1),
        k_proj(std::get<1>(shardwise_shapes(c)), seed + 2),
        v_proj(std::get<2>(shardwise_shapes(c)), seed + 3),
        c_proj(std::get<3>(shardwise_shapes(c)), seed + 4),
        config_(c) {}

  /// The shapes of q_proj, k_proj, v_proj and c_proj (with biases), which the constructor builds them from and
  /// sw::parameter_costs walks.
  static constexpr auto shardwise_shapes(GPT2Config const& c) {
    linear_shape const square{c.dim, c.dim};
    return std::tuple{square, square, square, square};
  }

  /// Called by sw::parallelize before any layer is cut: each rank must hold whole heads.
  constexpr void shardwise_on_parallelize(int tp) {
    constexpr bool sharded_heads = std::is_same_v<typename decltype(q_proj)::weight_grad_placement, Shard<0>>;
    if (sharded_heads && config_.heads % static_cast<std::size_t>(tp) != 0)
      shardwise::raise("shardwise::models::GPT2 at \"", own_style<Plan>::path.view(), "\": ", config_.heads,
                       " heads do not divide over ", tp,
                       " ranks; each rank computes whole heads: choose a tp size that divides the heads");
  }

  /// Its cost on one rank (sw::cost) for a config and s.tokens tokens: its own forward and backward, run on
  /// shapes (sw::derived_cost).
  static constexpr cost shardwise_cost(GPT2Config const& c, cost_inputs const& s) {
    using input = Activation<meta<T>, typename decltype(q_proj)::input_layout>;
    return derived_cost<GPT2Attention<meta<T>, Plan>, input>(s, c.dim, c, 0);
  }

  /// Called by sw::context_parallelize: from then on its rows are this rank's tokens of each sequence, attended
  /// across the cp ranks (GPT2 adds each token's position embedding at its global position).
  void shardwise_on_context_parallel(std::shared_ptr<context_parallel const> const& context) { context_ = context; }

  /// Forward on x [tokens, dim]; keeps what backward needs.
  template <class X>
  constexpr auto forward(X const& x) {
    q_ = q_proj(x), k_ = k_proj(x), v_ = v_proj(x);
    auto out = q_;
    attend_causal<T>(context_.get(), q_.local, k_.local, v_.local, sequence_lengths::every(config_.sequence),
                     config_.head_dim(), out.local, saved_);
    return c_proj(std::move(out));  // its storage becomes c_proj's kept input
  }

  /// Forward with a key-value cache (inference): attention of the step's new rows over each sequence's cached
  /// tokens (nn::cached_attention writes this layer's keys and values into `cache`); keeps nothing for backward.
  template <class X>
  auto forward(X const& x, cache_step const& step, nn::kv_layer<T>& cache) {
    auto q = q_proj(x), k = k_proj(x), v = v_proj(x);
    auto out = q;
    nn::cached_attention<T>(q.local, k.local, v.local, config_.head_dim(), step, cache, out.local);
    return c_proj(std::move(out));
  }

  /// Backward of the last forward: accumulates the parameter gradients and returns the input gradient.
  template <class DY>
  constexpr auto backward(DY const& dy) {
    auto dout = c_proj.backward(dy);
    auto dq = q_, dk = k_, dv = v_;
    attend_causal_backward<T>(context_.get(), dout.local, q_.local, k_.local, v_.local, saved_, dq.local, dk.local,
                              dv.local);
    return q_proj.backward(dq) + k_proj.backward(dk) + v_proj.backward(dv);  // Partial<Sum> under ColwiseParallel
  }

 private:
  GPT2Config config_;
  output_t<decltype(q_proj)> q_, k_, v_;
  nn::attention_saved<T> saved_;  // each query row's softmax logsumexp (and the output under the ring)
  context_slot<T> context_;       // set by sw::context_parallelize
};

/// The feed-forward: c_fc (dim -> 4 dim), gelu_new, c_proj (4 dim -> dim), both with bias.
template <class T, class Plan = serial_plan>
struct GPT2MLP {
  Linear<T, layer_at<Plan, "c_fc">> c_fc;      ///< dim -> 4 dim, with bias.
  Linear<T, layer_at<Plan, "c_proj">> c_proj;  ///< 4 dim -> dim, with bias.
  SHARDWISE_CHILDREN(c_fc, c_proj)
  SHARDWISE_HOOKS(token_wise)
  SHARDWISE_SAVED(h_)
  static constexpr bool shardwise_token_wise = true;  ///< Each token alone: its sequences may be cut over cp.

  /// The parameters are drawn from seed + 1 and seed + 2.
  constexpr GPT2MLP(GPT2Config const& c, init seed)
      : c_fc(std::get<0>(shardwise_shapes(c)), seed + 1), c_proj(std::get<1>(shardwise_shapes(c)), seed + 2) {}

  /// The shapes of c_fc and c_proj (with biases), which the constructor builds them from.
  static constexpr auto shardwise_shapes(GPT2Config const& c) {
    return std::tuple{linear_shape{c.dim, c.hidden()}, linear_shape{c.hidden(), c.dim}};
  }

  /// Its cost on one rank (sw::cost) for a config and s.tokens tokens: its own forward and backward, run on
  /// shapes (sw::derived_cost).
  static constexpr cost shardwise_cost(GPT2Config const& c, cost_inputs const& s) {
    using input = Activation<meta<T>, typename decltype(c_fc)::input_layout>;
    return derived_cost<GPT2MLP<meta<T>, Plan>, input>(s, c.dim, c, 0);
  }

  /// Forward on x [tokens, dim]; keeps what backward needs.
  template <class X>
  constexpr auto forward(X const& x) {
    h_ = c_fc(x);
    return c_proj(gelu_tanh(h_));
  }
  /// Backward of the last forward: accumulates the parameter gradients and returns the input gradient.
  template <class DY>
  constexpr auto backward(DY const& dy) {
    return c_fc.backward(gelu_tanh_backward(h_, c_proj.backward(dy)));
  }

 private:
  output_t<decltype(c_fc)> h_;  // before the activation: gelu_tanh_backward needs it
};

/// One block, pre-norm with residuals: h = x + attn(ln_1(x)), h + mlp(ln_2(h)).
template <class T, class Plan = serial_plan>
struct GPT2Block {
  LayerNorm<T, layer_at<Plan, "ln_1">> ln_1;     ///< LayerNorm before attention.
  GPT2Attention<T, subplan<Plan, "attn">> attn;  ///< The attention.
  LayerNorm<T, layer_at<Plan, "ln_2">> ln_2;     ///< LayerNorm before the MLP.
  GPT2MLP<T, subplan<Plan, "mlp">> mlp;          ///< The MLP.
  SHARDWISE_CHILDREN(ln_1, attn, ln_2, mlp)
  SHARDWISE_HOOKS(token_wise)
  SHARDWISE_SAVED()
  static constexpr bool shardwise_token_wise = true;  ///< Residuals, token by token: the attention sees across.

  /// The attention's parameters are drawn from `seed`, the MLP's from seed + 10.
  constexpr GPT2Block(GPT2Config const& c, init seed)
      : ln_1(std::get<0>(shardwise_shapes(c)), static_cast<T>(c.layer_norm_eps), seed),
        attn(c, seed),
        ln_2(std::get<2>(shardwise_shapes(c)), static_cast<T>(c.layer_norm_eps), seed),
        mlp(c, seed + 10) {}

  /// Its children's shapes: the norms', the attention's and the MLP's.
  static constexpr auto shardwise_shapes(GPT2Config const& c) {
    return std::tuple{norm_shape{c.dim}, decltype(attn)::shardwise_shapes(c), norm_shape{c.dim},
                      decltype(mlp)::shardwise_shapes(c)};
  }

  /// Its cost on one rank (sw::cost): its own forward and backward, run on shapes (sw::derived_cost), its input
  /// in the residual stream's layout.
  static constexpr cost shardwise_cost(GPT2Config const& c, cost_inputs const& s) {
    using input = Activation<meta<T>, typename decltype(ln_1)::input_layout>;
    return derived_cost<GPT2Block<meta<T>, Plan>, input>(s, c.dim, c, 0);
  }

  /// Forward on x [tokens, dim]: two pre-norm residual branches; sw::residual calls each child through
  /// sw::forward, which applies its plan entry (PrepareModuleInput under sequence parallelism).
  template <class X>
  constexpr auto forward(X const& x) {
    return residual(ln_2, mlp, residual(ln_1, attn, x));
  }
  /// Forward with a key-value cache (inference): the same branches, the attention given the step and this
  /// block's cache.
  template <class X>
  auto forward(X const& x, cache_step const& step, nn::kv_layer<T>& cache) {
    return residual(ln_2, mlp, residual(ln_1, attn, x, step, cache));
  }
  /// Backward of the last forward: accumulates the parameter gradients and returns the input gradient.
  template <class DY>
  constexpr auto backward(DY const& dy) {
    return residual_backward(ln_1, attn, residual_backward(ln_2, mlp, dy));
  }
};

/// The decoder. forward(ids) takes a batch of whole sequences of config.sequence tokens (positions restart at
/// 0 in each) and gives logits [tokens, vocabulary] (this rank's part, in the plan's layout); backward(dlogits)
/// accumulates every parameter's gradient. lm_head computes with wte's table: one tensor, walked, stepped and
/// saved once, as "wte.weight".
template <class T, class Plan = serial_plan>
struct GPT2 {
  Embedding<T, layer_at<Plan, "wte">> wte;            ///< Token embedding [vocabulary, dim].
  Embedding<T, layer_at<Plan, "wpe">> wpe;            ///< Position embedding [sequence, dim].
  std::vector<GPT2Block<T, subplan<Plan, "h.*">>> h;  ///< The blocks.
  LayerNorm<T, layer_at<Plan, "ln_f">> ln_f;          ///< The final LayerNorm.
  Linear<T, layer_at<Plan, "lm_head">> lm_head;       ///< The LM head, dim -> vocabulary, no bias, tied to wte.
  SHARDWISE_CHILDREN(wte, wpe, h, ln_f, lm_head)
  SHARDWISE_HOOKS(config, on_context_parallel, position_limit)
  SHARDWISE_SAVED()  // positions_ is a cache of position ids, not an activation

  /// Builds the model from `c` (parameters drawn from c.seed, embeddings N(0, 0.02)); throws if dim does not
  /// divide into the heads.
  constexpr explicit GPT2(GPT2Config const& c)
      : wte(std::get<0>(shardwise_shapes((c.check(), c))), c.seed),
        wpe(std::get<1>(shardwise_shapes(c)), c.seed + 1),
        ln_f(std::get<3>(shardwise_shapes(c)), static_cast<T>(c.layer_norm_eps), c.seed),
        lm_head(std::get<4>(shardwise_shapes(c)).each, c.seed + 2),
        config_(c) {
    if (c.heads == 0 || c.dim % c.heads != 0)
      shardwise::raise("shardwise::models::GPT2: dim ", c.dim, " does not divide into ", c.heads,
                       " heads; choose a dim that is a multiple of the heads");
    // transformers' initializer_range: N(0, 0.02) embeddings (Embedding draws N(0, 1)); a lazily constructed
    // table is empty here and filled from a checkpoint.
    wte.weight *= T(0.02);
    wpe.weight *= T(0.02);
    h.reserve(c.layers);
    for (std::size_t i = 0; i < c.layers; ++i) h.emplace_back(c, c.seed + 100 * (i + 1));
    tie_weights(lm_head, wte);  // the plan must cut both the same way: checked at compile time
    // A vocabulary (or, where the plan cuts wpe, a position count) the tp size does not divide is padded at
    // parallelize with zero rows no id reaches, as Megatron does; the loss leaves the padded logits out.
    wte.pad_vocabulary_for_tp();
    lm_head.pad_outputs_for_tp();
    wpe.pad_vocabulary_for_tp();
  }

  /// Its cost on one rank (sw::cost) for a config and s.tokens tokens: its own forward and backward, run on shapes
  /// (sw::derived_model_cost).
  static constexpr cost shardwise_cost(GPT2Config const& c, cost_inputs const& s) {
    return derived_model_cost<GPT2<meta<T>, Plan>>(s, [](auto&) {}, c);
  }

  /// Its children's shapes, which the constructor builds them from: wte, wpe, c.layers blocks, ln_f, and the LM
  /// head, whose weight is wte's (no parameter of its own).
  static constexpr auto shardwise_shapes(GPT2Config const& c) {
    using Block = GPT2Block<T, subplan<Plan, "h.*">>;
    return std::tuple{embedding_shape{c.vocabulary, c.dim}, embedding_shape{c.sequence, c.dim},
                      repeated_shape{c.layers, Block::shardwise_shapes(c)}, norm_shape{c.dim},
                      only_if(false, linear_shape{c.dim, c.vocabulary, false})};
  }

  /// Its parameters, in the order of sw::for_each_parameter (lm_head's weight is wte's: not walked), as costs
  /// that walk them see them (sw::parameter_cost): fn is called once per parameter (sw::parameter_costs over its
  /// shapes).
  template <class Fn>
  static constexpr void shardwise_parameter_costs(GPT2Config const& c, cost_inputs const& s, Fn&& fn) {
    parameter_costs<GPT2>(shardwise_shapes(c), s, fn);
  }

  /// The config the model was built from.
  [[nodiscard]] GPT2Config const& config() const { return config_; }
  /// What checkpoints store beside the weights, and check on load: GPT2Config::fields().
  [[nodiscard]] std::map<std::string, std::string> shardwise_config() const { return config_.fields(); }

  /// Called by sw::context_parallelize: from then on forward takes this rank's tokens of each sequence, each
  /// given its position embedding at its global position.
  void shardwise_on_context_parallel(std::shared_ptr<context_parallel const> const& context) {
    if (context->split().sequence != config_.sequence)
      shardwise::raise("shardwise::models::GPT2: the context_split cuts sequences of ", context->split().sequence,
                       " tokens but the model's are ", config_.sequence, " (config().sequence); split the same length");
    context_ = context;
  }

  /// Logits [tokens, vocabulary] for the token ids (whole sequences of config().sequence tokens; under context
  /// parallelism, this rank's tokens of each: sw::context_parallel::positions()).
  constexpr auto forward(token_ids_t<T> ids) {
    auto x = wte(ids) + wpe(positions(ids));
    for (auto& block : h) x = shardwise::forward(block, x);  // FSDP units gather here
    return lm_head(ln_f(x));
  }

  /// Forward with a key-value cache (inference, sw::generate): `ids` are the step's new tokens, packed as its
  /// entries are (kv_cache::append), at their positions in their sequences (at most config().sequence, wpe's
  /// rows); gives the logits of each entry's last token, [entries, vocabulary] (this rank's part). Each block's
  /// activations are dropped after it. Needs the residual stream whole on every rank (no sequence parallelism).
  auto forward(std::span<const std::int64_t> ids, cache_step const& step, kv_cache<T>& cache) {
    using Stream = decltype(wte(ids));
    static_assert(std::is_same_v<typename Stream::placement, Replicate>,
                  "shardwise::models::GPT2: a forward with a key-value cache needs the residual stream whole on "
                  "every rank; build the model for inference with gpt2_plan<false> (no sequence parallelism): its "
                  "weights are cut as under sequence parallelism, so the same checkpoints load");
    if (context_.get())
      shardwise::raise(
          "shardwise::models::GPT2::forward: a forward with a key-value cache on a model cut over cp "
          "(sw::context_parallelize); generate with a model that is not");
    if (ids.size() != step.rows())
      shardwise::raise("shardwise::models::GPT2::forward: ", ids.size(), " token ids for a step of ", step.rows(),
                       " new tokens; give one id per new token, the step's entries in order");
    if (step.capacity > config_.sequence)
      shardwise::raise("shardwise::models::GPT2::forward: a cache of ", step.capacity, " positions, but wpe holds ",
                       config_.sequence, " (n_positions); give the cache a capacity of at most ", config_.sequence);
    positions_ = step.positions();
    auto x = wte(ids) + wpe(positions_);
    for (std::size_t i = 0; i < h.size(); ++i) {
      x = shardwise::forward(h[i], x, step, cache.layer(i));
      drop_saved_activations(h[i]);
    }
    Stream last{x.local(step.last_rows(), Eigen::all)};
    auto logits = lm_head(ln_f(last));
    drop_saved_activations(*this);
    return logits;
  }

  /// The shape of its key-value cache on this rank (after parallelize: this rank's heads).
  [[nodiscard]] kv_cache_shape shardwise_kv_shape() const {
    return {h.size(), h.empty() ? 0 : static_cast<std::size_t>(h.front().attn.k_proj.weight.rows()),
            config_.head_dim()};
  }
  /// The bytes of its key-value cache on one of `tp` ranks for `sequences` sequences of `capacity` positions, at
  /// compile time if need be (sw::kv_cache<T>::bytes() of the cache generate allocates): 2 x layers x this rank's
  /// heads x head_dim x capacity x sequences x sizeof(T).
  static constexpr std::size_t kv_cache_bytes(GPT2Config const& c, std::size_t tp, std::size_t sequences,
                                              std::size_t capacity) {
    using Attention = GPT2Attention<T, subplan<subplan<Plan, "h.*">, "attn">>;
    constexpr bool sharded = std::is_same_v<typename decltype(Attention::k_proj)::weight_grad_placement, Shard<0>>;
    return kv_cache<T>::bytes_for({c.layers, c.dim / (sharded ? tp : 1), c.head_dim()}, sequences, capacity);
  }

  /// The positions a sequence may reach: wpe's rows (n_positions); sw::generate refuses a longer cache up front.
  [[nodiscard]] std::size_t shardwise_position_limit() const { return config_.sequence; }

  /// Backward of the last forward from the logits' gradient: accumulates every parameter's gradient.
  template <class DY>
  constexpr void backward(DY const& dlogits) {
    auto dx = ln_f.backward(lm_head.backward(dlogits));
    for (auto block = h.rbegin(); block != h.rend(); ++block) dx = shardwise::backward(*block, dx);
    wte.backward(dx);
    wpe.backward(dx);  // the sum's gradient reaches both embeddings unchanged
  }

 private:
  /// The position of every token of `ids`: 0, 1, ..., sequence - 1, again for each sequence of the batch (under
  /// context parallelism, this rank's positions in each); on shapes, as many as the ids.
  constexpr token_ids_t<T> positions(token_ids_t<T> ids) {
    if constexpr (is_meta_v<T>) {
      return ids;
    } else {
      context_parallel const* const context = context_.get();
      std::size_t const tokens = ids.size(), rows = context ? context->tokens() : config_.sequence;
      if (tokens % rows != 0)
        shardwise::raise("shardwise::models::GPT2: ", tokens, " ids are not whole sequences of ", rows,
                         context ? " tokens (this cp rank's tokens of each sequence)" : " tokens",
                         "; give forward a batch of complete sequences");
      positions_.resize(tokens);
      for (std::size_t i = 0; i < tokens; ++i)
        positions_[i] = context ? context->positions()[i % rows] : static_cast<std::int64_t>(i % rows);
      return positions_;
    }
  }

  GPT2Config config_;
  std::vector<std::int64_t> positions_;
  context_slot<T> context_;  // set by sw::context_parallelize
};

}  // namespace shardwise::models

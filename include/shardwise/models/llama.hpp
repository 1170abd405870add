#pragma once
// A Llama-style decoder written against shardwise's public API, the way a user would write it: token
// embedding, RMSNorm, rotary position embedding (Hugging Face's rotate-half convention), causal grouped-query
// attention, SwiGLU feed-forward, final norm, output projection (untied: its weights are not shared with the
// embedding); forward and backward. The plan decides how it is sharded (models/llama_plan.hpp); with
// sw::serial_plan it is the unsharded reference.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "shardwise/core/show.hpp"
#include "shardwise/inference/cached_attention.hpp"
#include "shardwise/models/llama_attention.hpp"
#include "shardwise/models/llama_config.hpp"
#include "shardwise/models/llama_feed_forward.hpp"
#include "shardwise/models/moe.hpp"
#include "shardwise/nn.hpp"

namespace shardwise::models {

namespace detail {
/// Reads `prefix` and the number after it from the front of `name` ("layers." and 6 of "layers.6.attention"), which
/// moves past them; false if absent. How a checkpoint's tensor name tells its block, and its expert.
inline bool number_after(std::string_view& name, std::string_view prefix, std::size_t& number) {
  if (!name.starts_with(prefix)) return false;
  name.remove_prefix(prefix.size());
  auto const [end, failed] = std::from_chars(name.data(), name.data() + name.size(), number);
  if (failed != std::errc{} || end == name.data()) return false;
  name.remove_prefix(static_cast<std::size_t>(end - name.data()));
  return true;
}
/// Whether `rest`, a checkpoint's tensor name past its block's number, names an expert of the block's feed-forward
/// `experts` that this rank does not hold (placed on another ep rank).
template <class Experts>
bool names_expert_elsewhere(std::string_view rest, Experts const& experts) {
  std::size_t expert = 0;
  return number_after(rest, ".feed_forward.experts.", expert) && rest.starts_with('.') && !experts.holds_expert(expert);
}
}  // namespace detail

/// The StaticExperts of a dense model: its blocks hold a dense feed-forward (LlamaFeedForward), not experts.
inline constexpr std::size_t no_experts = static_cast<std::size_t>(-1);

/// One decoder block, pre-norm with residuals: h = x + attention(attention_norm(x)), h + feed_forward(ffn_norm(h)).
/// StaticExperts: no_experts for a dense feed-forward; else a mixture of experts (MoeFeedForward) of that many
/// experts (dynamic_size: the config's count).
template <class T, class Plan = serial_plan, std::size_t StaticHeads = dynamic_size,
          std::size_t StaticKvHeads = dynamic_size, std::size_t StaticExperts = no_experts>
struct LlamaBlock {
  /// The feed-forward's type: dense, or a mixture of experts.
  using FeedForward =
      std::conditional_t<StaticExperts == no_experts, LlamaFeedForward<T, subplan<Plan, "feed_forward">>,
                         MoeFeedForward<T, subplan<Plan, "feed_forward">, StaticExperts>>;
  RMSNorm<T, layer_at<Plan, "attention_norm">> attention_norm;                          ///< Norm before attention.
  LlamaAttention<T, subplan<Plan, "attention">, StaticHeads, StaticKvHeads> attention;  ///< The attention.
  RMSNorm<T, layer_at<Plan, "ffn_norm">> ffn_norm;  ///< Norm before the feed-forward.
  FeedForward feed_forward;                         ///< The feed-forward.
  SHARDWISE_CHILDREN(attention_norm, attention, ffn_norm, feed_forward)
  SHARDWISE_HOOKS(token_wise)
  SHARDWISE_SAVED()
  static constexpr bool shardwise_token_wise = true;  ///< Residuals, token by token: the attention sees across.
  /// The attention's type.
  using Attention = LlamaAttention<T, subplan<Plan, "attention">, StaticHeads, StaticKvHeads>;

  /// The attention's parameters are drawn from `seed`, the feed-forward's from seed + 10.
  constexpr LlamaBlock(LlamaConfig const& c, init seed)
      : attention_norm(std::get<0>(shardwise_shapes(c)), static_cast<T>(c.norm_eps), seed),
        attention(c, seed),
        ffn_norm(std::get<2>(shardwise_shapes(c)), static_cast<T>(c.norm_eps), seed),
        feed_forward(c, seed + 10) {}

  /// Its children's shapes (the norms', the attention's and the feed-forward's) at `tp` ranks, for
  /// sw::parameter_costs.
  static constexpr auto shardwise_shapes(LlamaConfig const& c, std::size_t tp = 0) {
    using Attention = decltype(attention);
    return std::tuple{norm_shape{c.dim}, Attention::shardwise_shapes(c, tp), norm_shape{c.dim},
                      FeedForward::shardwise_shapes(c, tp)};
  }

  /// Its cost on one rank (sw::cost) for a config and s.tokens tokens: its own forward and backward, run on
  /// shapes (sw::derived_cost), its input in the residual stream's layout.
  static constexpr cost shardwise_cost(LlamaConfig const& c, cost_inputs const& s) {
    static_assert(StaticExperts == no_experts,
                  "shardwise::models::LlamaBlock::shardwise_cost: the cost of a block of experts is not derived; "
                  "cost the dense model");
    using input = Activation<meta<T>, typename decltype(attention_norm)::input_layout>;
    return derived_cost<LlamaBlock<meta<T>, Plan, StaticHeads, StaticKvHeads>, input>(s, c.dim, c, 0);
  }

  /// Forward on x [tokens, dim], whose rows are the sequences `rows` (empty: whole sequences of config().sequence):
  /// two pre-norm residual branches; sw::residual calls each child through sw::forward, which applies its plan
  /// entry (PrepareModuleInput under sequence parallelism).
  template <class X>
  constexpr auto forward(X const& x, sequence_lengths const& rows = {}) {
    return residual(ffn_norm, feed_forward, residual(attention_norm, attention, x, rows));
  }
  /// Forward with a key-value cache (inference): the same branches, the attention given the step and this
  /// block's cache.
  template <class X>
  auto forward(X const& x, cache_step const& step, nn::kv_layer<T>& cache) {
    return residual(ffn_norm, feed_forward, residual(attention_norm, attention, x, step, cache));
  }
  /// Backward of the last forward: accumulates the parameter gradients and returns the input gradient.
  template <class DY>
  constexpr auto backward(DY const& dy) {
    return residual_backward(attention_norm, attention, residual_backward(ffn_norm, feed_forward, dy));
  }
};

/// The decoder. forward(ids) gives logits [tokens, vocabulary] (this rank's part, in the plan's layout);
/// backward(dlogits) accumulates every parameter's gradient. StaticHeads / StaticKvHeads (optional): the head
/// counts at compile time, so that a static tp size that cannot serve them is a compile error. StaticExperts:
/// no_experts (dense) or the blocks' experts (models::MoeLlama).
template <class T, class Plan = serial_plan, std::size_t StaticHeads = dynamic_size,
          std::size_t StaticKvHeads = dynamic_size, std::size_t StaticExperts = no_experts>
struct Llama {
  /// The decoder block's type (what sw::wrap_type<...> names to make each block an FSDP unit).
  using block_type = LlamaBlock<T, subplan<Plan, "layers.*">, StaticHeads, StaticKvHeads, StaticExperts>;
  /// Whether its blocks hold experts (a MoeLlama).
  static constexpr bool sparse = StaticExperts != no_experts;
  Embedding<T, layer_at<Plan, "tok_embeddings">> tok_embeddings;  ///< Token embedding.
  std::vector<block_type> layers;                                 ///< The blocks.
  RMSNorm<T, layer_at<Plan, "norm">> norm;                        ///< The final norm.
  Linear<T, layer_at<Plan, "output">> output;                     ///< Output projection, dim -> vocabulary, no bias.
  SHARDWISE_CHILDREN(tok_embeddings, layers, norm, output)
  SHARDWISE_HOOKS(config, on_context_parallel, other_stage)
  SHARDWISE_SAVED(block_inputs_, rows_)

  /// The residual stream between blocks, in the plan's layout (Shard<0> under sequence parallelism).
  using stream = Activation<T, typename decltype(tok_embeddings)::output_layout>;

  /// Builds the model from `c` (parameters drawn from c.seed), tying the output to the embedding when
  /// c.tie_word_embeddings is set.
  constexpr explicit Llama(LlamaConfig const& c)
      : tok_embeddings(std::get<0>(shardwise_shapes(checked(c))), c.seed),
        norm(std::get<2>(shardwise_shapes(c)), static_cast<T>(c.norm_eps), c.seed),
        output(std::get<3>(shardwise_shapes(c)).each, c.seed + 1),
        config_(c) {
    if (c.rope_scaling.type == rope_type::unsupported && !is_meta_v<T>)  // on shapes nothing rotates
      shardwise::raise(
          "shardwise::models::Llama: the config asks for a rotary scaling shardwise does not compute (only "
          "\"linear\", \"llama3\" and \"yarn\" are built); it would compute other numbers: use a model with one of "
          "those or none");
    layers.reserve(c.layers);
    for (std::size_t i = 0; i < c.layers; ++i) layers.emplace_back(c.for_layer(i), c.seed + 100 * (i + 1));
    if (c.tie_word_embeddings) tie_output_to_embedding();
    // A vocabulary the tp size does not divide is padded at parallelize (zero embedding rows no id reaches,
    // zero output rows the loss leaves out), as Megatron does.
    tok_embeddings.pad_vocabulary_for_tp();
    output.pad_outputs_for_tp();
  }

  /// Its cost on one rank (sw::cost) for a config and s.tokens tokens per forward: its own forward and backward,
  /// run on shapes (sw::derived_model_cost). With `checkpointed_blocks` (checkpoint_blocks(true)) each block keeps
  /// only its input between forward and backward, and its forward's transfers run again in the backward.
  static constexpr cost shardwise_cost(LlamaConfig const& c, cost_inputs const& s, bool checkpointed_blocks = false) {
    static_assert(!sparse,
                  "shardwise::models::Llama::shardwise_cost: the cost of a model of experts (MoeLlama) is not "
                  "derived; cost the dense model");
    using shapes = Llama<meta<T>, Plan, StaticHeads, StaticKvHeads>;
    return derived_model_cost<shapes>(s, [&](shapes& model) { model.checkpoint_blocks(checkpointed_blocks); }, c);
  }

  /// Its children's shapes at `tp` ranks, which the constructor builds them from: the embedding, c.layers
  /// blocks, the final norm, and the output projection, which holds no weight of its own when tied.
  static constexpr auto shardwise_shapes(LlamaConfig const& c, std::size_t tp = 0) {
    return std::tuple{embedding_shape{c.vocabulary, c.dim},
                      repeated_shape{c.layers, block_type::shardwise_shapes(c, tp)}, norm_shape{c.dim},
                      only_if(!c.tie_word_embeddings, linear_shape{c.dim, c.vocabulary, false})};
  }

  /// This rank's parameters, in the order of sw::for_each_parameter, as costs that walk them see them
  /// (sw::parameter_cost): fn is called once per parameter (sw::parameter_costs over its shapes).
  template <class Fn>
  static constexpr void shardwise_parameter_costs(LlamaConfig const& c, cost_inputs const& s, Fn&& fn) {
    parameter_costs<Llama>(shardwise_shapes(c, s.tp), s, fn);
  }

  /// Whether the plan cuts the output projection and the embedding the same way, as tied weights need.
  static constexpr bool can_tie = std::is_same_v<typename decltype(output)::weight_grad_placement,
                                                 typename decltype(tok_embeddings)::weight_grad_placement>;

  /// The config the model was built from.
  [[nodiscard]] LlamaConfig const& config() const { return config_; }
  /// What checkpoints store beside the weights, and check on load: LlamaConfig::fields().
  [[nodiscard]] std::map<std::string, std::string> shardwise_config() const { return config_.fields(); }

  /// Called by sw::context_parallelize: from then on forward takes this rank's tokens of each sequence.
  void shardwise_on_context_parallel(std::shared_ptr<context_parallel const> const& context) {
    if (context->split().sequence != config_.sequence)
      shardwise::raise("shardwise::models::Llama: the context_split cuts sequences of ", context->split().sequence,
                       " tokens but the model's are ", config_.sequence, " (config().sequence); split the same length");
    rows_per_sequence_ = context->tokens();
    context_ = context;
  }

  /// Logits [tokens, vocabulary] for the token ids, whose rows are the sequences `rows` (under context parallelism:
  /// the documents packed into the whole sequences, of which this rank holds its tokens): each attends within
  /// itself, its positions counted from 0 at its first token. sequence_lengths::every(n): a batch of rows of n
  /// tokens; {5, 9, 2}: sequences (documents packed into a row, say) of 5, 9 and 2 tokens. None longer than
  /// config().sequence (the capacity). Empty: whole sequences of config().sequence; under context parallelism,
  /// this rank's tokens of each (sw::context_parallel::positions()), and `rows` the documents packed into those
  /// whole sequences (none crossing from one into the next).
  constexpr auto forward(token_ids_t<T> ids, sequence_lengths const& rows = {}) {
    rows_ = checked_rows(ids.size(), rows);
    stream h = tok_embeddings(ids);
    if (checkpoint_blocks_) block_inputs_.resize(layers.size());
    for (std::size_t i = 0; i < layers.size(); ++i)  // through sw::forward: FSDP units gather here
      h = checkpoint_blocks_ ? checkpointed_forward(layers[i], h, block_inputs_[i], rows_)
                             : shardwise::forward(layers[i], h, rows_);
    if constexpr (sparse) {                                   // transformers' loss pools every layer's router scores
      std::vector<typename block_type::FeedForward*> blocks;  // not a view: clang 14 cannot take libstdc++ 12's
      for (block_type& b : layers) blocks.push_back(&b.feed_forward);
      if (context_parallel const* context = context_.get(); !context) {
        router_aux_loss_ = load_balancing_loss(blocks, router_aux_scale_);
      } else {  // over every cp rank's tokens; each rank's gradient times the ranks, which the data average divides
        router_aux_loss_ = load_balancing_loss(blocks, router_aux_scale_ * context->split().ranks,
                                               [&](std::vector<double>& totals) { context->sum(totals); });
      }
    }
    return output(norm(h));
  }

  /// The load-balancing loss of the last forward of a MoeLlama: transformers' aux_loss (with
  /// output_router_logits), over all its blocks' router scores together (models::load_balancing_loss). The
  /// training loss is the cross-entropy plus router_aux_loss_coef times it; backward adds that term's gradient.
  [[nodiscard]] double router_aux_loss() const
    requires sparse
  {
    return router_aux_loss_;
  }

  /// The scale of the load-balancing loss's gradient, which backward adds times router_aux_loss_coef: 1 by default;
  /// under gradient accumulation the cross-entropy's gradient's (1/microbatches), so that a step's gradient is that
  /// of the mean of its microbatches' losses (as a pipeline of MoeLlamaStage computes it).
  void router_aux_loss_scale(double scale)
    requires sparse
  {
    router_aux_scale_ = scale;
  }

  /// Whether `name` is the tensor of an expert that another ep rank holds (the experts placed by
  /// sw::expert_parallelize): load_sharded then reads only this rank's experts of a checkpoint that holds them all.
  [[nodiscard]] bool shardwise_other_stage(std::string_view name) const
    requires sparse
  {
    std::size_t block = 0;
    return detail::number_after(name, "layers.", block) && block < layers.size() &&
           detail::names_expert_elsewhere(name, layers[block].feed_forward);
  }

  /// Forward with a key-value cache (inference, sw::generate): `ids` are the step's new tokens, packed as its
  /// entries are (kv_cache::append); gives the logits of each entry's last token, [entries, vocabulary] (this
  /// rank's part, in the plan's layout). Each block's activations are dropped after it: nothing is kept for
  /// backward. Needs the residual stream whole on every rank (no sequence parallelism).
  auto forward(std::span<const std::int64_t> ids, cache_step const& step, kv_cache<T>& cache) {
    static_assert(std::is_same_v<typename stream::placement, Replicate>,
                  "shardwise::models::Llama: a forward with a key-value cache needs the residual stream whole on "
                  "every rank; build the model for inference with llama_plan<false> (no sequence parallelism): its "
                  "weights are cut as under sequence parallelism, so the same checkpoints load");
    if (rows_per_sequence_)
      shardwise::raise(
          "shardwise::models::Llama::forward: a forward with a key-value cache on a model cut over cp "
          "(sw::context_parallelize); generate with a model that is not");
    if (ids.size() != step.rows())
      shardwise::raise("shardwise::models::Llama::forward: ", ids.size(), " token ids for a step of ", step.rows(),
                       " new tokens; give one id per new token, the step's entries in order");
    stream h = tok_embeddings(ids);
    for (std::size_t i = 0; i < layers.size(); ++i) {
      h = shardwise::forward(layers[i], h, step, cache.layer(i));
      drop_saved_activations(layers[i]);
    }
    stream last{h.local(step.last_rows(), Eigen::all)};
    auto logits = output(norm(last));
    drop_saved_activations(*this);
    return logits;
  }

  /// The shape of its key-value cache on this rank (after parallelize: this rank's key-value heads), with each
  /// layer's sliding window (a layer with one keeps only its window's positions).
  [[nodiscard]] kv_cache_shape shardwise_kv_shape() const {
    return {layers.size(), layers.empty() ? 0 : static_cast<std::size_t>(layers.front().attention.wk.weight.rows()),
            config_.head_dim(), layer_windows(config_)};
  }

  /// The bytes of its key-value cache on one of `tp` ranks for `sequences` sequences of `capacity` positions, at
  /// compile time if need be (sw::kv_cache<T>::bytes() of the cache generate allocates): 2 x this rank's key-value
  /// heads (kv_size_multiplier copies included) x head_dim x sequences x sizeof(T) x the positions each layer keeps
  /// (capacity, or its sliding window when shorter).
  static constexpr std::size_t kv_cache_bytes(LlamaConfig const& c, std::size_t tp, std::size_t sequences,
                                              std::size_t capacity) {
    linear_shape const wk = std::get<1>(block_type::Attention::shardwise_shapes(c, tp));
    std::size_t const columns = wk.out * wk.copies;
    std::size_t const ranks = block_type::Attention::sharded_heads ? tp : 1;
    return kv_cache<T>::bytes_for({c.layers, columns / ranks, c.head_dim(), layer_windows(c)}, sequences, capacity);
  }

  /// Activation checkpointing per transformer block (Accelerate's activation_checkpointing, torchtitan's "full"
  /// mode): each block keeps only its input between its forward and its backward and runs its forward again in
  /// the backward. The same numbers, bit for bit; off by default.
  constexpr void checkpoint_blocks(bool on) { checkpoint_blocks_ = on; }

  /// Backward of the last forward from the logits' gradient: accumulates every parameter's gradient.
  template <class DY>
  constexpr void backward(DY const& dlogits) {
    stream dh = norm.backward(output.backward(dlogits));
    for (std::size_t i = layers.size(); i-- > 0;)
      dh = checkpoint_blocks_ ? checkpointed_backward(layers[i], block_inputs_[i], dh, rows_)
                              : shardwise::backward(layers[i], dh);
    tok_embeddings.backward(dh);
  }

 private:
  /// `c`, checked (LlamaConfig::check), and refused when it has experts and the type none, or the other way.
  static constexpr LlamaConfig const& checked(LlamaConfig const& c) {
    c.check();
    if (c.moe.has_value() != sparse)
      shardwise::raise("shardwise::models::Llama: the config ", sparse ? "has no experts" : "has experts (moe)",
                       " but the model type ", sparse ? "is a MoeLlama" : "is dense",
                       sparse ? "; build models::Llama, or give the config a MoeConfig"
                              : "; build models::MoeLlama for a mixture of experts");
    return c;
  }

  /// Each layer's sliding window (0: none), for its key-value cache.
  static constexpr std::vector<std::size_t> layer_windows(LlamaConfig const& c) {
    std::vector<std::size_t> windows;  // push_back: clang with libstdc++ 12 cannot evaluate vector(n) at compile time
    for (std::size_t i = 0; i < c.layers; ++i) windows.push_back(c.window_at(i));
    return windows;
  }

  /// The sequences of a forward's `tokens` rows: `rows` checked against them and the capacity, or when empty,
  /// whole sequences of config().sequence (under cp: of this rank's tokens of each, which the context cuts).
  constexpr sequence_lengths checked_rows(std::size_t tokens, sequence_lengths const& rows) const {
    if (rows_per_sequence_ && !rows.empty()) {  // documents packed into the whole sequences the cp ranks share
      if constexpr (!is_meta_v<T>) {
        if (tokens % rows_per_sequence_ != 0)
          shardwise::raise("shardwise::models::Llama::forward: ", tokens, " token ids are not whole sequences of ",
                           rows_per_sequence_, " (this cp rank's tokens of each sequence); give it its tokens of ",
                           "every sequence (context_parallel::my_tokens)");
        rows.check(tokens / rows_per_sequence_ * config_.sequence,
                   "shardwise::models::Llama::forward (documents packed into sequences cut over cp)", config_.sequence);
      }
      return rows;
    }
    if (rows.empty()) {
      std::size_t const whole = rows_per_sequence_ ? rows_per_sequence_ : config_.sequence;
      if (!is_meta_v<T> && tokens % whole != 0)  // on shapes: s.tokens are the rank's, whatever the cut
        shardwise::raise("shardwise::models::Llama::forward: ", tokens, " token ids are not whole sequences of ", whole,
                         rows_per_sequence_ ? " (this cp rank's tokens of each sequence)" : " (config().sequence)",
                         "; give it a batch of whole sequences, or each sequence's length (sequence_lengths)");
      return sequence_lengths::every(config_.sequence);
    }
    if constexpr (!is_meta_v<T>) rows.check(tokens, "shardwise::models::Llama::forward", config_.sequence);
    return rows;
  }

  constexpr void tie_output_to_embedding() {
    if constexpr (can_tie)
      tie_weights(output, tok_embeddings);
    else
      shardwise::raise(
          "shardwise::models::Llama: tie_word_embeddings needs the plan to cut \"output\" and "
          "\"tok_embeddings\" the same way (ColwiseParallel with RowwiseParallel, as llama_plan "
          "does with parallelize_embeddings on); parallelize the embeddings or untie them");
  }

  LlamaConfig config_;
  std::size_t rows_per_sequence_ = 0;  // this cp rank's tokens of each sequence; 0: not context-parallel
  sequence_lengths rows_;              // the sequences of the last forward's rows
  bool checkpoint_blocks_ = false;
  std::vector<checkpointed_input<stream>> block_inputs_;  // per block, when checkpointing blocks
  double router_aux_loss_ = 0;                            // of the last forward, with experts
  double router_aux_scale_ = 1;                           // its gradient's scale (router_aux_loss_scale)
  context_slot<T> context_;                               // set by sw::context_parallelize (none on shapes)
};

/// A Llama whose blocks hold a mixture of experts in place of the dense feed-forward (Mixtral, Qwen2-MoE,
/// Qwen3-MoE): built from a LlamaConfig with `moe`. StaticExperts (optional): the expert count at compile time.
template <class T, class Plan = serial_plan, std::size_t StaticExperts = dynamic_size>
using MoeLlama = Llama<T, Plan, dynamic_size, dynamic_size, StaticExperts>;

/// Cross-entropy matching the logits' layout: loss parallel on vocabulary-sharded logits, plain otherwise.
/// `vocabulary`: the real vocabulary size, so the columns of vocabulary padding are left out.
template <class Mesh, class T, class P>
constexpr LossAndGradient<T, P> llama_loss(Mesh const& tp, Activation<T, P> const& logits, token_ids_t<T> targets,
                                           std::size_t vocabulary) {
  return cross_entropy(tp, logits, targets, -100, static_cast<std::int64_t>(vocabulary));
}

/// As above, on logits given as a temporary (`llama_loss(tp, model.forward(ids), ...)`): the gradient is written
/// into their storage, so the loss allocates no logits-sized matrix.
template <class Mesh, class T, class P>
constexpr LossAndGradient<T, P> llama_loss(Mesh const& tp, Activation<T, P>&& logits, token_ids_t<T> targets,
                                           std::size_t vocabulary) {
  return cross_entropy(tp, std::move(logits), targets, -100, static_cast<std::int64_t>(vocabulary));
}

/// llama_loss normalised over the step's valid tokens (sw::count_valid_tokens): this call's share of the mean over
/// every data rank's and microbatch's valid targets, and its gradient for the optimizer's average over the data ranks
/// (see sw::cross_entropy).
template <class Mesh, class T, class P>
LossAndGradient<T, P> llama_loss(Mesh const& tp, Activation<T, P> const& logits, std::span<const std::int64_t> targets,
                                 std::size_t vocabulary, valid_tokens const& tokens) {
  return cross_entropy(tp, logits, targets, tokens, -100, static_cast<std::int64_t>(vocabulary));
}

/// As above, on logits given as a temporary: the gradient is written into their storage.
template <class Mesh, class T, class P>
LossAndGradient<T, P> llama_loss(Mesh const& tp, Activation<T, P>&& logits, std::span<const std::int64_t> targets,
                                 std::size_t vocabulary, valid_tokens const& tokens) {
  return cross_entropy(tp, std::move(logits), targets, tokens, -100, static_cast<std::int64_t>(vocabulary));
}

/// The sizes of a training step, for its cost: the tensor-parallel side (the tokens of one microbatch on this dp
/// rank, the tp size and this rank on it) and the data-parallel side.
struct training_step_inputs {
  cost_inputs tp;                   ///< One microbatch's tokens, and the tensor-parallel axis.
  std::size_t microbatches = 1;     ///< Forward and backward passes per step (gradient accumulation).
  std::size_t dp = 1;               ///< Ranks on the data-parallel axis.
  std::size_t dp_rank = 0;          ///< This rank's coordinate on it.
  bool zero1 = false;               ///< AdamW with ZeRO-1 (AdamWOptions::zero1).
  std::string_view dp_axis = "dp";  ///< The data-parallel axis' name.
};

/// The transfers of one training step of Llama<T, Plan> on one rank, in order: per microbatch its forward,
/// models::llama_loss and its backward (recomputing each block's forward first, with `checkpointed_blocks`), the
/// model's own code run on shapes (sw::derived_passes); then sw::finish_gradients and AdamW::step(finished, dp).
template <class T, class Plan, std::size_t Capacity = 128>
constexpr transfer_list<Capacity> llama_step_cost(LlamaConfig const& c, training_step_inputs const& t,
                                                  bool checkpointed_blocks = false) {
  using Model = Llama<T, Plan>;
  using Shapes = Llama<meta<T>, Plan>;
  transfer_list<Capacity> list = derived_passes<Shapes, Capacity>(
      t.tp, t.microbatches, [&](Shapes& model) { model.checkpoint_blocks(checkpointed_blocks); },
      [&](auto&& logits, meta_ids ids) {
        return llama_loss(*logits.local.trace(), std::move(logits), ids, c.vocabulary).dlogits;
      },
      c);
  auto const walk = [&](auto&& fn) { Model::shardwise_parameter_costs(c, t.tp, fn); };
  list.append(finish_gradients_cost<Capacity>(walk, t.tp));
  list.append(AdamW<T>::template step_cost<Capacity>(walk, t.zero1, t.dp, t.dp_rank, t.tp, t.dp_axis));
  return list;
}

}  // namespace shardwise::models

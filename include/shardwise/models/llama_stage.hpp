#pragma once
// One pipeline stage of the Llama model (models/llama.hpp): the blocks [first, first + count) of the stack,
// the token embedding on the first stage, the final norm and output projection on the last. Its parameters
// are the unsharded model's (the same seeds) under the same names ("layers.6.attention.wq.weight" on the
// stage that holds block 6), so stages' checkpoints name the model's tensors alike. Run by
// sw::run_pipeline_step over a "pp" axis; the plan (llama_plan) cuts each stage over "tp" as it cuts Llama.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardwise/models/llama.hpp"
#include "shardwise/models/llama_plan.hpp"
#include "shardwise/pipeline/cost.hpp"
#include "shardwise/pipeline/stages.hpp"

namespace shardwise::models {

/// Stage `stage` of a Llama model cut into stages by `split`. forward(ids) on the first stage and forward(h)
/// on the others give the residual stream (in the plan's layout: Shard<0> under sequence parallelism) that
/// crosses to the next stage; head_loss on the last stage runs the final norm, the output projection and the
/// loss, and gives the stream's gradient; backward(dh) runs the stage's blocks backward (and the embedding's
/// on the first stage). StaticExperts: as Llama's (models::MoeLlamaStage: blocks of experts).
template <class T, class Plan = serial_plan, std::size_t StaticHeads = dynamic_size,
          std::size_t StaticKvHeads = dynamic_size, std::size_t StaticExperts = no_experts>
struct LlamaStage {
  using embedding_type = Embedding<T, layer_at<Plan, "tok_embeddings">>;  ///< The token embedding.
  /// One decoder block.
  using block_type = LlamaBlock<T, subplan<Plan, "layers.*">, StaticHeads, StaticKvHeads, StaticExperts>;
  /// Whether its blocks hold experts (a MoeLlamaStage).
  static constexpr bool sparse = StaticExperts != no_experts;
  /// The residual stream between blocks and between stages.
  using stream = Activation<T, typename embedding_type::output_layout>;

  std::optional<embedding_type> tok_embeddings;               ///< Token embedding (first stage only).
  layer_slice<block_type> layers;                             ///< The stage's blocks, named by model index.
  std::optional<RMSNorm<T, layer_at<Plan, "norm">>> norm;     ///< The final norm (last stage only).
  std::optional<Linear<T, layer_at<Plan, "output">>> output;  ///< Output projection (last stage only).
  SHARDWISE_CHILDREN(tok_embeddings, layers, norm, output)
  SHARDWISE_HOOKS(config, other_stage, after_pipeline_step, on_context_parallel, pipeline_microbatch, pipeline_carry)
  SHARDWISE_SAVED(block_inputs_, rows_)

  /// Builds stage `stage` of `split` (which must cut c.layers blocks) with the unsharded model's parameters.
  LlamaStage(LlamaConfig const& c, stage_split const& split, int stage)
      : LlamaStage(c, checked_range(c, split, stage), split.stages()) {}

  /// Builds the stage holding `range` of c.layers blocks, one of `stages` (which tied embeddings across stages
  /// need: shardwise_after_pipeline_step), with the unsharded model's parameters.
  constexpr LlamaStage(LlamaConfig const& c, stage_range const& range, int stages)
      : config_((c.check(), c)), stages_(stages) {
    if (range.count == 0 || range.first + range.count > c.layers || stages < 1 ||
        (stages == 1) != (range.count == c.layers))
      shardwise::raise("shardwise::models::LlamaStage: blocks [", range.first, ", ", range.first + range.count,
                       ") as one of ", stages, " stages of a model of ", c.layers,
                       " layers; give a non-empty range within the layers, and one stage only for all of them");
    if (c.moe.has_value() != sparse)
      shardwise::raise("shardwise::models::LlamaStage: the config ", sparse ? "has no experts" : "has experts (moe)",
                       " but the stage type ", sparse ? "is a MoeLlamaStage" : "is dense",
                       sparse ? "; build models::LlamaStage, or give the config a MoeConfig"
                              : "; build models::MoeLlamaStage for a mixture of experts");
    first_ = range.first == 0, last_ = range.first + range.count == c.layers;
    auto const shapes = shardwise_shapes(c, range);
    if (first_) tok_embeddings.emplace(std::get<0>(shapes).each, c.seed);
    layers.first = range.first;
    layers.reserve(range.count);
    for (std::size_t i = range.first; i < range.first + range.count; ++i)
      layers.emplace_back(c.for_layer(i), c.seed + 100 * (i + 1));
    if (last_) {
      norm.emplace(std::get<2>(shapes).each, static_cast<T>(c.norm_eps), c.seed);
      output.emplace(std::get<3>(shapes).each, c.seed + 1);
      if (c.tie_word_embeddings) tie_output();
      output->pad_outputs_for_tp();
    }
    if (first_) tok_embeddings->pad_vocabulary_for_tp();
  }

  /// Activation checkpointing per transformer block (optimum-neuron's
  /// pipeline_parallel_gradient_checkpointing_enabled): each block keeps only its input between its forward and
  /// its backward, and runs its forward again in the backward. The same numbers, bit for bit; off by default.
  constexpr void checkpoint_blocks(bool on) { checkpoint_blocks_ = on; }

  /// Called by sw::run_pipeline_step at the end of each step: with tie_word_embeddings over several stages,
  /// the first stage's embedding and the last stage's copy of it as the output exchange their gradients over
  /// the pipeline axis and each adds the other's (a + b = b + a exactly), so the two stay one value. `shape`
  /// says which rank holds the last stage.
  template <class Mesh>
  void shardwise_after_pipeline_step(Mesh const& pp, pipeline_shape const& shape) {
    if (!config_.tie_word_embeddings || (first_ && last_)) return;
    int const last_rank = shape.rank_of(stages_ - 1);
    if (first_ && last_rank == pp.rank())
      shardwise::raise(
          "shardwise::models::LlamaStage: tie_word_embeddings with the first and last stages on one "
          "rank (interleaved chunks on one pipeline rank, or ZeroBubbleV's V placement) is not supported; untie "
          "them or use more pipeline ranks (and a loop placement)");
    constexpr int tag = shardwise::detail::max_tag;  // after the step's messages, which are all received by now
    if (first_) exchange_and_add(pp, *tok_embeddings, tok_embeddings->weight_grad, last_rank, tag, true);
    if (last_) exchange_and_add(pp, *output, output->weight_grad, 0, tag, false);
  }
  /// The same under the loop placement (chunk c of rank r is stage c * ranks + r).
  template <class Mesh>
  void shardwise_after_pipeline_step(Mesh const& pp) {
    shardwise_after_pipeline_step(pp, pipeline_shape{pp.size(), stages_ / pp.size()});
  }

  /// Whether this stage holds the embedding (stage 0).
  [[nodiscard]] constexpr bool is_first() const { return first_; }
  /// Whether this stage holds the final norm and the output projection (the last stage).
  [[nodiscard]] constexpr bool is_last() const { return last_; }
  /// The config the model was built from.
  [[nodiscard]] LlamaConfig const& config() const { return config_; }
  /// What checkpoints store beside the weights: LlamaConfig::fields(), as Llama's.
  [[nodiscard]] std::map<std::string, std::string> shardwise_config() const { return config_.fields(); }

  /// Whether `name` is a tensor of the whole model that another stage holds (a checkpoint of all stages is
  /// loaded into this one: load_sharded reads only this stage's tensors and skips those).
  [[nodiscard]] bool shardwise_other_stage(std::string_view name) const {
    if (name.starts_with("tok_embeddings.")) return !first_;
    if (name.starts_with("norm.") || name.starts_with("output.")) return !last_;
    std::size_t block = 0;
    if (!detail::number_after(name, "layers.", block) || !name.starts_with('.') || block >= config_.layers)
      return false;
    if (block < layers.first || block >= layers.first + layers.size()) return true;
    if constexpr (sparse)  // and experts placed on another ep rank
      return detail::names_expert_elsewhere(name, layers[block - layers.first].feed_forward);
    return false;
  }

  /// Called by sw::context_parallelize: from then on the first stage takes this rank's tokens of each sequence,
  /// and every stage's stream holds those tokens' rows (the blocks' attention sees across the cp ranks).
  void shardwise_on_context_parallel(std::shared_ptr<context_parallel const> const& context) {
    if (sparse)  // its carry would pool each cp rank's router totals alone: another loss, silently
      shardwise::raise(
          "shardwise::models::LlamaStage: context parallelism of a stage of experts (MoeLlamaStage) is not built "
          "yet: its load-balancing loss would pool each cp rank's tokens alone; cut a MoeLlama over cp without "
          "pipeline stages, or a MoeLlamaStage without cp");
    if (context->split().sequence != config_.sequence)
      shardwise::raise("shardwise::models::LlamaStage: the context_split cuts sequences of ", context->split().sequence,
                       " tokens but the model's are ", config_.sequence, " (config().sequence); split the same length");
    if (!microbatch_rows_.empty())
      shardwise::raise(
          "shardwise::models::LlamaStage: context parallelism on a stage given sequence lengths "
          "(microbatch_rows); it cuts whole sequences of config().sequence: give none");
    rows_per_sequence_ = context->tokens();
  }

  /// The sequences of each microbatch's rows, for sw::run_pipeline_step on every stage: microbatch m's rows are
  /// `rows[m]` (documents packed back to back, each attending within itself, its positions from 0; as
  /// Llama::forward's `rows`). Left empty (the default): whole sequences of config().sequence. Not under context
  /// parallelism, which cuts whole sequences.
  void microbatch_rows(std::vector<sequence_lengths> rows) {
    if (rows_per_sequence_ && !rows.empty())
      shardwise::raise(
          "shardwise::models::LlamaStage::microbatch_rows: sequence lengths given to a stage cut over cp "
          "(sw::context_parallelize), which cuts whole sequences of config().sequence; give none, or run the "
          "sequences without context parallelism");
    microbatch_rows_ = std::move(rows);
  }
  /// Called by sw::run_pipeline_step before each forward: the sequences of that microbatch's rows.
  void shardwise_pipeline_microbatch(int microbatch) {
    microbatch_ = microbatch;
    if (microbatch_rows_.empty()) return rows_ = {}, void();
    if (microbatch < 0 || static_cast<std::size_t>(microbatch) >= microbatch_rows_.size())
      shardwise::raise("shardwise::models::LlamaStage: the pipeline runs microbatch ", microbatch, " but ",
                       microbatch_rows_.size(), " microbatches' rows were given (microbatch_rows); give one ",
                       "sequence_lengths per microbatch of the step");
    rows_ = microbatch_rows_[static_cast<std::size_t>(microbatch)];
  }

  /// The first stage's forward: the embedding of the token ids (whole sequences; under context parallelism, this
  /// rank's tokens of each: sw::context_parallel::positions(); in a pipeline step with microbatch_rows, that
  /// microbatch's sequences), then its blocks.
  constexpr stream forward(token_ids_t<T> ids) {
    if (!first_)
      shardwise::raise("shardwise::models::LlamaStage::forward: token ids given to stage holding layers ", layers.first,
                       "..", layers.first + layers.size(), ", which has no embedding; give them to the first stage");
    std::size_t const rows = rows_per_sequence_ ? rows_per_sequence_ : config_.sequence;
    if constexpr (!is_meta_v<T>) {  // on shapes: s.tokens are the rank's, whatever the cut
      if (!rows_.empty())
        rows_.check(ids.size(), "shardwise::models::LlamaStage::forward", config_.sequence);
      else if (ids.size() % rows != 0)
        shardwise::raise("shardwise::models::LlamaStage::forward: ", ids.size(),
                         " token ids are not whole sequences of ", rows,
                         rows_per_sequence_ ? " (this cp rank's tokens of each sequence)" : " (config().sequence)",
                         "; give it a batch of whole sequences, or each microbatch's lengths (microbatch_rows)");
    }
    return forward((*tok_embeddings)(ids));
  }

  /// The stage's blocks on the residual stream received from the stage before.
  constexpr stream forward(stream h) {
    if (!checkpoint_blocks_) {
      for (auto& block : layers) h = shardwise::forward(block, h, rows_);  // FSDP units gather here
      return h;
    }
    block_inputs_.resize(layers.size());
    for (std::size_t i = 0; i < layers.size(); ++i) h = checkpointed_forward(layers[i], h, block_inputs_[i], rows_);
    return h;
  }

  /// Backward of the stage's last forward from the gradient of its output: accumulates the parameter
  /// gradients; returns the gradient of its input (empty on the first stage, whose input is token ids).
  constexpr stream backward(stream dh) {
    for (std::size_t i = layers.size(); i-- > 0;)
      dh = checkpoint_blocks_ ? checkpointed_backward(layers[i], block_inputs_[i], dh, rows_)
                              : shardwise::backward(layers[i], dh);
    if (!first_) return dh;
    tok_embeddings->backward(dh);
    return {};
  }

  /// A microbatch's loss and the gradient of `scale` times it with respect to the last stage's output.
  struct head_result {
    T loss;           ///< The mean cross-entropy over the microbatch's targets (unscaled), or its share of the step's.
    stream gradient;  ///< The gradient with respect to the stream, for backward.
  };

  /// On the last stage: the final norm, the output projection and the loss (llama_loss) on the stream h for
  /// `targets`, then their backward from the loss's gradient times `scale` (1 / microbatches for the mean
  /// over a step's microbatches): accumulates the head's gradients and returns the loss and the stream's
  /// gradient.
  template <class Mesh>
  constexpr head_result head_loss(Mesh const& tp, stream const& h, token_ids_t<T> targets, T scale = T(1)) {
    if (!last_)
      shardwise::raise("shardwise::models::LlamaStage::head_loss: the stage holding layers ", layers.first, "..",
                       layers.first + layers.size(), " is not the last; compute the loss on the last stage");
    auto result = llama_loss(tp, (*output)((*norm)(h)), targets, config_.vocabulary);
    result.dlogits.local *= scale;
    if constexpr (sparse) {  // the load-balancing loss's gradient takes the same scale, on every stage
      if (head_scales_.size() <= static_cast<std::size_t>(microbatch_)) head_scales_.resize(microbatch_ + 1, 1.0);
      head_scales_[static_cast<std::size_t>(microbatch_)] = static_cast<double>(scale);
    }
    return {result.loss, norm->backward(output->backward(result.dlogits))};
  }

  /// The load-balancing loss of the last forward on the last stage of a MoeLlamaStage pipeline: transformers'
  /// aux_loss over every stage's blocks (their router loads came with the stream: shardwise_pipeline_carry). The
  /// microbatch's training loss is head_loss's plus router_aux_loss_coef times it; each stage's backward adds that
  /// term's gradient times head_loss's `scale`.
  [[nodiscard]] double router_aux_loss() const
    requires sparse
  {
    if (!last_)
      shardwise::raise("shardwise::models::LlamaStage::router_aux_loss: the stage holding layers ", layers.first, "..",
                       layers.first + layers.size(), " is not the last; the loss pools every stage's blocks there");
    return router_aux_loss_;
  }

  /// Called by sw::run_pipeline_step (hooks::pipeline_carry): after a forward, the router totals of the stages
  /// before (router_totals, packed) plus this stage's blocks', which go on with the stream (on the last stage they
  /// give router_aux_loss); before a backward, the totals of every stage and head_loss's scale, which its blocks'
  /// backward differentiates the load-balancing loss with, and which go back with the gradient.
  nn::vector<double> shardwise_pipeline_carry(nn::vector<double> const& received, pipeline_pass pass, int microbatch)
    requires sparse
  {
    std::vector<double> all(received.data(), received.data() + received.size());
    if (pass == pipeline_pass::forward) {
      router_totals totals = router_totals::unpacked(all);
      for (auto& block : layers) totals.add(block.feed_forward.balance());
      if (last_) router_aux_loss_ = totals.loss();
      all = totals.packed();
    } else {
      auto const m = static_cast<std::size_t>(microbatch);
      if (last_) all.push_back(m < head_scales_.size() ? head_scales_[m] : 1.0);  // the turn: head_loss's scale
      double const scale = all.back();
      router_totals const totals = router_totals::unpacked(std::span(all).first(all.size() - 1));
      std::vector<double> const share = totals.shares();
      for (auto& block : layers) block.feed_forward.use_pooled_loads(share, totals.rows, scale);
    }
    return Eigen::Map<nn::vector<double> const>(all.data(), static_cast<Eigen::Index>(all.size()));
  }

  /// As above, with the loss normalised over the step's valid tokens (sw::count_valid_tokens over every
  /// microbatch): `loss` is the microbatch's share of the step's mean, and the shares add up to it.
  template <class Mesh>
  head_result head_loss(Mesh const& tp, stream const& h, std::span<const std::int64_t> targets,
                        valid_tokens const& tokens) {
    static_assert(!sparse,
                  "shardwise::models::LlamaStage::head_loss: a stage of experts scales its load-balancing loss's "
                  "gradient as the cross-entropy's; normalising over the step's valid tokens is not built for it: "
                  "give head_loss(tp, h, targets, scale)");
    if (!last_)
      shardwise::raise("shardwise::models::LlamaStage::head_loss: the stage holding layers ", layers.first, "..",
                       layers.first + layers.size(), " is not the last; compute the loss on the last stage");
    auto result = llama_loss(tp, (*output)((*norm)(h)), targets, config_.vocabulary, tokens);
    return {result.loss, norm->backward(output->backward(result.dlogits))};
  }

  /// Its cost on one rank (sw::cost) as the stage holding `blocks` of config `c`, for s.tokens tokens per
  /// microbatch: its own code run on shapes as sw::run_pipeline_step runs it (sw::derived_stage_cost). Forward:
  /// the embedding's transfers (first stage), its blocks', and on the last stage the head's, which head_loss runs
  /// right after the forward. Backward: its blocks' in reverse (each block's forward first, with
  /// `checkpointed_blocks`), then the embedding's. For sw::pipeline_step_cost's stage_transfers.
  static constexpr cost shardwise_cost(LlamaConfig const& c, stage_range const& blocks, cost_inputs const& s,
                                       bool checkpointed_blocks = false) {
    static_assert(!sparse,
                  "shardwise::models::LlamaStage::shardwise_cost: the cost of a stage of experts (MoeLlamaStage) is "
                  "not derived; cost the dense model's stage");
    return derived_stage_cost<shapes_type, typename shapes_type::stream>(
        s, c.dim, true, [&](shapes_type& stage) { stage.checkpoint_blocks(checkpointed_blocks); }, c, blocks,
        stages_around(c, blocks));
  }

  /// What sw::pipeline_step_cost needs of this stage (sw::stage_transfers): shardwise_cost's forward and backward;
  /// with `stage_recomputed` (pipeline_options' activations = stage_activations::recompute) the forward's
  /// transfers but the head's, run again before each backward; with tied embeddings over several stages, the
  /// exchange of the table's gradient after the step over `pp_axis` (the first stage sends first, the last
  /// receives first).
  static constexpr stage_transfers<> shardwise_pipeline_transfers(LlamaConfig const& c, stage_range const& blocks,
                                                                  cost_inputs const& s,
                                                                  bool checkpointed_blocks = false,
                                                                  bool stage_recomputed = false,
                                                                  std::string_view pp_axis = "pp") {
    bool const first = blocks.first == 0, last = blocks.first + blocks.count == c.layers;
    cost const stage = shardwise_cost(c, blocks, s, checkpointed_blocks);
    stage_transfers<> t{stage.forward, stage.backward, {}, {}};
    if (stage_recomputed)  // the stage's forward again, without the head
      t.recompute = derived_stage_cost<shapes_type, typename shapes_type::stream>(
                        s, c.dim, false, [](auto&) {}, c, blocks, stages_around(c, blocks))
                        .forward;
    // Stated, not run: shardwise_after_pipeline_step exchanges the table's gradient over the pp mesh, which a run on
    // shapes has no stand-in for; one send and one receive of it, in the order the first and last stages make them.
    if (c.tie_word_embeddings && first != last) {
      std::size_t const table = embedding_type::shardwise_cost(c.vocabulary, c.dim, s).gradient_bytes;
      transfer_kind const one = first ? transfer_kind::send : transfer_kind::recv;
      transfer_kind const other = first ? transfer_kind::recv : transfer_kind::send;
      t.after_step.add(one, pp_axis, table).add(other, pp_axis, table);
    }
    return t;
  }

  /// Its children's shapes at `tp` ranks, which the constructor builds them from: the embedding on the first
  /// stage, the blocks of `blocks`, and the final norm and output projection on the last (whose weight is the
  /// embedding's when tied on one stage; a later stage holds a copy of the table).
  static constexpr auto shardwise_shapes(LlamaConfig const& c, stage_range const& blocks, std::size_t tp = 0) {
    bool const first = blocks.first == 0, last = blocks.first + blocks.count == c.layers;
    auto const whole = Llama<T, Plan, StaticHeads, StaticKvHeads, StaticExperts>::shardwise_shapes(c, tp);
    auto const output = std::get<3>(whole).each;
    return std::tuple{only_if(first, std::get<0>(whole)), repeated_shape{blocks.count, std::get<1>(whole).each},
                      only_if(last, std::get<2>(whole)), only_if(last && !(c.tie_word_embeddings && first), output)};
  }

  /// The stage's parameters, in the order of sw::for_each_parameter, as costs that walk them see them
  /// (sw::parameter_cost; for sw::finish_gradients_cost and AdamW::step_cost): fn is called once per parameter
  /// (sw::parameter_costs over its shapes).
  template <class Fn>
  static constexpr void shardwise_parameter_costs(LlamaConfig const& c, stage_range const& blocks, cost_inputs const& s,
                                                  Fn&& fn) {
    parameter_costs<LlamaStage>(shardwise_shapes(c, blocks, s.tp), s, fn);
  }

  /// The stage on shapes, which its costs run (build it from (config, blocks, stages_around(config, blocks))).
  using shapes_type = LlamaStage<meta<T>, Plan, StaticHeads, StaticKvHeads>;
  /// A stage count `blocks` can be one of (its cost does not depend on it).
  static constexpr int stages_around(LlamaConfig const& c, stage_range const& blocks) {
    return blocks.count == c.layers ? 1 : 2;
  }

 private:
  /// Ties the output to the embedding: the same tensor on one stage; across stages, a copy of the embedding's
  /// initial table, marked as the first stage's "tok_embeddings.weight" (see Parameter::mirror_of).
  constexpr void tie_output() {
    if constexpr (!Llama<T, Plan, StaticHeads, StaticKvHeads>::can_tie) {
      shardwise::raise(
          "shardwise::models::LlamaStage: tie_word_embeddings needs the plan to cut \"output\" and "
          "\"tok_embeddings\" the same way (as llama_plan does with parallelize_embeddings on)");
    } else if (first_) {
      tie_weights(*output, *tok_embeddings);
    } else {
      output->weight = embedding_type(config_.vocabulary, config_.dim, config_.seed).weight;
      output->mirror_weight_of("tok_embeddings.weight");
    }
  }

  /// Sends this stage's `grad` to `peer`'s stage and adds the one received, in an order that cannot wait on
  /// itself (the first stage sends first, the last receives first).
  template <class Mesh, class Layer, class Matrix>
  static void exchange_and_add(Mesh const& pp, Layer& layer, Matrix& grad, int peer, int tag, bool send_first) {
    if (grad.size() == 0) layer.zero_grad();  // no backward yet (a freshly loaded stage): zeros
    Matrix other;
    if (send_first) send(pp, grad, peer, tag);
    recv(pp, other, peer, tag);
    if (!send_first) send(pp, grad, peer, tag);
    grad += other;
  }

  /// split.of(stage), once the split is known to cut c.layers blocks.
  static stage_range checked_range(LlamaConfig const& c, stage_split const& split, int stage) {
    if (split.layers() != c.layers)
      shardwise::raise("shardwise::models::LlamaStage: the stage split cuts ", split.layers(),
                       " layers but the config has ", c.layers, "; build the split from config.layers");
    return split.of(stage);
  }

  LlamaConfig config_;
  int stages_ = 1;
  std::size_t rows_per_sequence_ = 0;  // this cp rank's tokens of each sequence; 0 without context parallelism
  bool first_ = false, last_ = false, checkpoint_blocks_ = false;
  std::vector<checkpointed_input<stream>> block_inputs_;  // per block, when checkpointing blocks
  std::vector<sequence_lengths> microbatch_rows_;         // per microbatch of a pipeline step (empty: whole rows)
  sequence_lengths rows_;  // the sequences of the forward's rows (empty: whole sequences of config().sequence)
  int microbatch_ = 0;     // the microbatch of the last forward (shardwise_pipeline_microbatch)
  std::vector<double> head_scales_;  // with experts: head_loss's scale per microbatch
  double router_aux_loss_ = 0;       // with experts, on the last stage: of the last forward
};

/// One pipeline stage of a models::MoeLlama: blocks of experts, whose router loads cross the stages beside the
/// stream, so that the load-balancing loss pools every block as transformers' does. StaticExperts (optional): the
/// expert count at compile time.
template <class T, class Plan = serial_plan, std::size_t StaticExperts = dynamic_size>
using MoeLlamaStage = LlamaStage<T, Plan, dynamic_size, dynamic_size, StaticExperts>;

}  // namespace shardwise::models

#pragma once
// The transfers of a Llama training step under FSDP (sw::fully_shard with each block a unit, as torchtitan
// wraps: fsdp_policy<Strategy, wrap_paths<"layers.*">>), alone on a dp mesh or with tensor parallelism: every
// parameter's gather and gradient reduction in the order fully_shard runs them, between the layers' own tp
// transfers, from the model's parameter walk (this tp rank's rows, cut by torch.chunk over dp).
#include <cstddef>
#include <string_view>
#include <type_traits>

#include "shardwise/cost/cost.hpp"
#include "shardwise/cost/transfer.hpp"
#include "shardwise/fsdp/policy.hpp"
#include "shardwise/models/llama.hpp"
#include "shardwise/placement/chunk.hpp"

namespace shardwise::models {

/// How fully_shard's wrap policy cut the Llama model into units.
enum class llama_fsdp_wrap {
  blocks,  ///< wrap_paths<"layers.*"> or wrap_type of its block: a unit per block (torchtitan's).
  none,    ///< wrap_none: the root unit holds every parameter.
  by_size  ///< wrap_min_params with fsdp_cost_options::min_num_params (children first: attention, feed-forward, block).
};

/// What changes the order or the size of an FSDP step's transfers besides the strategy and the precision: the
/// fsdp_options and the model's settings the step ran with.
struct fsdp_cost_options {
  llama_fsdp_wrap wrap = llama_fsdp_wrap::blocks;  ///< The units (prefetch and checkpointing: blocks only).
  std::size_t min_num_params = 100'000'000;        ///< fsdp_options::min_num_params, for llama_fsdp_wrap::by_size.
  bool forward_prefetch = false;                   ///< fsdp_options::forward_prefetch.
  bool backward_prefetch = false;                  ///< fsdp_options::backward_prefetch.
  bool checkpointed_blocks = false;                ///< Llama::checkpoint_blocks(true): each block's forward runs again.
  std::size_t replicate = 1;                       ///< Hybrid sharding: the replicate mesh's size (1: none).
  std::string_view replicate_axis = "replicate";   ///< Its axis' name.
};

namespace detail {

/// The element sizes an FSDP step moves: its gathers' (the precision's param_type) and its reductions'.
struct fsdp_element_sizes {
  std::size_t gathered = 4;  ///< Bytes per gathered parameter element.
  std::size_t reduced = 4;   ///< Bytes per reduced gradient element.
};

/// Elements per row of a parameter (FSDP cuts its rows over dp).
constexpr std::size_t per_row(parameter_cost const& p) {
  if (p.rows == 0)
    shardwise::raise(
        "shardwise::models::llama_fsdp_step_cost: a parameter_cost without rows; the model's "
        "shardwise_parameter_costs must give each parameter's rows");
  return p.elements / p.rows;
}

/// Appends a parameter's gather: this rank's rows of it.
template <std::size_t Capacity>
constexpr void add_gather(transfer_list<Capacity>& list, parameter_cost const& p, training_step_inputs const& t,
                          fsdp_element_sizes e) {
  list.add(transfer_kind::all_gather, t.dp_axis, chunk_size(p.rows, t.dp, t.dp_rank) * per_row(p) * e.gathered);
}

/// Appends a parameter's gradient reduction over dp: reduce-scattered (and under hybrid sharding this rank's
/// rows averaged over the replicas), or, no_shard, all-reduced.
template <std::size_t Capacity>
constexpr void add_reduction(transfer_list<Capacity>& list, bool sharded, parameter_cost const& p,
                             training_step_inputs const& t, fsdp_element_sizes e, fsdp_cost_options const& o) {
  std::size_t const row = per_row(p) * e.reduced;
  list.add(sharded ? transfer_kind::reduce_scatter : transfer_kind::all_reduce, t.dp_axis, p.rows * row);
  if (sharded && o.replicate > 1)
    list.add(transfer_kind::all_reduce, o.replicate_axis, chunk_size(p.rows, t.dp, t.dp_rank) * row);
}

/// The element sizes of a precision (full_precision or mixed_precision<Param, Reduce>) for a model of T.
template <class T, class Precision>
constexpr fsdp_element_sizes fsdp_sizes() {
  if constexpr (requires { typename Precision::param_type; })
    return {sizeof(typename Precision::param_type), sizeof(typename Precision::reduce_type)};
  else
    return {sizeof(T), sizeof(T)};
}

/// Which modules of a block are units of their own: the block, its attention, its feed-forward.
struct llama_block_units {
  bool block = false;         ///< The block (holding its norms and what no child unit holds).
  bool attention = false;     ///< The attention (wq, wk, wv, wo).
  bool feed_forward = false;  ///< The feed-forward (w1, w3, w2).
};

/// The units wrap policy `o.wrap` makes of each block of config `c` at `tp` ranks; by size, as fully_shard
/// counts: this rank's pieces times tp (key-value heads with their copies), children first, a module whose
/// parameters no unit holds yet reach min_num_params.
template <class Model>
constexpr llama_block_units block_units(LlamaConfig const& c, fsdp_cost_options const& o, std::size_t tp) {
  if (o.wrap == llama_fsdp_wrap::blocks) return {true, false, false};
  if (o.wrap == llama_fsdp_wrap::none) return {};
  using Attention = decltype(std::declval<typename Model::block_type&>().attention);
  std::size_t const copies =
      Attention::sharded_heads ? kv_size_multiplier(c.heads, c.kv_heads, tp, c.kv_size_multiplier) : 1;
  std::size_t const q = c.heads * c.head_dim(), kv = c.kv_heads * copies * c.head_dim();  // as fully_shard counts
  std::size_t const attention = 2 * q * c.dim + 2 * kv * c.dim, feed_forward = 3 * c.hidden * c.dim;
  llama_block_units u{false, attention >= o.min_num_params, feed_forward >= o.min_num_params};
  std::size_t const rest = 2 * c.dim + (u.attention ? 0 : attention) + (u.feed_forward ? 0 : feed_forward);
  u.block = rest >= o.min_num_params;
  return u;
}

/// Calls fn(p) for each parameter of Llama<T, Plan> that unit `owner` holds — 0 the root (the embedding, the
/// final norm, the output, and what no unit of a block holds), 1 block `layer`, 2 its attention, 3 its
/// feed-forward — in walk order (sw::parameter_costs over the model's shapes, child by child).
template <class Model, class Fn>
constexpr void for_unit_parameters(LlamaConfig const& c, cost_inputs const& s, llama_block_units const& u, int owner,
                                   std::size_t layer, Fn&& fn) {
  using Block = typename Model::block_type;
  auto const shapes = Model::shardwise_shapes(c, s.tp);
  auto const block = std::get<1>(shapes).each;
  int const in_block = u.block ? 1 : 0;
  auto const walk = [&]<class Node>(std::type_identity<Node>, int holder, auto const& shape) {
    if (holder == owner) parameter_costs<Node>(shape, s, fn);
  };
  walk(std::type_identity<decltype(std::declval<Model&>().tok_embeddings)>{}, 0, std::get<0>(shapes));
  for (std::size_t i = 0; i < std::get<1>(shapes).count; ++i) {
    if (owner != 0 && i != layer) continue;
    walk(std::type_identity<decltype(std::declval<Block&>().attention_norm)>{}, in_block, std::get<0>(block));
    walk(std::type_identity<decltype(std::declval<Block&>().attention)>{}, u.attention ? 2 : in_block,
         std::get<1>(block));
    walk(std::type_identity<decltype(std::declval<Block&>().ffn_norm)>{}, in_block, std::get<2>(block));
    walk(std::type_identity<decltype(std::declval<Block&>().feed_forward)>{}, u.feed_forward ? 3 : in_block,
         std::get<3>(block));
  }
  walk(std::type_identity<decltype(std::declval<Model&>().norm)>{}, 0, std::get<2>(shapes));
  walk(std::type_identity<decltype(std::declval<Model&>().output)>{}, 0, std::get<3>(shapes));
}

/// Appends the gathers of unit `owner`'s parameters (of layer `layer` for a block's units).
template <class Model, std::size_t Capacity>
constexpr void add_unit_gathers(transfer_list<Capacity>& list, LlamaConfig const& c, training_step_inputs const& t,
                                llama_block_units const& u, int owner, std::size_t layer, fsdp_element_sizes e) {
  for_unit_parameters<Model>(c, t.tp, u, owner, layer, [&](parameter_cost const& p) { add_gather(list, p, t, e); });
}

/// Appends what a unit's backward ends with: each gradient finished over tp (sw::finish_gradients' step for that
/// parameter), then each reduced over dp.
template <class Model, std::size_t Capacity>
constexpr void add_unit_reductions(transfer_list<Capacity>& list, LlamaConfig const& c, training_step_inputs const& t,
                                   llama_block_units const& u, int owner, std::size_t layer, bool sharded,
                                   fsdp_element_sizes e, fsdp_cost_options const& o) {
  auto const walk = [&](auto&& fn) { for_unit_parameters<Model>(c, t.tp, u, owner, layer, fn); };
  list.append(finish_gradients_cost<Capacity>(walk, t.tp));
  walk([&](parameter_cost const& p) { add_reduction(list, sharded, p, t, e, o); });
}

/// llama_fsdp_transfers for units other than whole blocks (wrap_none, wrap_min_params): the hooks of each
/// unit's module gather before its plan entry moves its input (or its output's gradient) and reduce before
/// it moves its input's gradient back.
template <class T, class Strategy, class Plan, std::size_t Capacity>
constexpr transfer_list<Capacity> llama_fsdp_transfers_by_module(LlamaConfig const& c, training_step_inputs const& t,
                                                                 fsdp_element_sizes e, fsdp_cost_options const& o,
                                                                 bool parallelized) {
  using Model = Llama<T, Plan>;
  using Block = typename Model::block_type;
  using Attention = decltype(std::declval<Block&>().attention);
  using FeedForward = decltype(std::declval<Block&>().feed_forward);
  using Logits = typename decltype(std::declval<Model&>().output)::output_layout;
  constexpr bool sharded = !std::is_same_v<Strategy, no_shard>;
  constexpr bool again = std::is_same_v<Strategy, full_shard>;
  llama_block_units const u = block_units<Model>(c, o, t.tp.tp);
  llama_cost_parts const parts = Model::shardwise_cost_parts(c, t.tp);
  cost const loss = cross_entropy_cost<T, Logits>(t.tp.tokens, t.tp);
  cost const attention = Attention::shardwise_cost(c, t.tp), feed_forward = FeedForward::shardwise_cost(c, t.tp);
  call_boundary const around_block = call_boundary_cost<Block, T>(c.dim, c.dim, t.tp);
  call_boundary const around_attention = call_boundary_cost<Attention, T>(c.dim, c.dim, t.tp);
  call_boundary const around_feed_forward = call_boundary_cost<FeedForward, T>(c.dim, c.dim, t.tp);
  transfer_list<Capacity> list;
  auto const gather = [&](int owner, std::size_t layer, bool when) {
    if (sharded && when) add_unit_gathers<Model>(list, c, t, u, owner, layer, e);
  };
  auto const reduce = [&](int owner, std::size_t layer) {
    add_unit_reductions<Model>(list, c, t, u, owner, layer, sharded, e, o);
  };
  auto const child_forward = [&](bool unit, int owner, std::size_t l, call_boundary const& b, cost const& inner) {
    gather(owner, l, unit);
    list.append(b.forward_in).append(inner.forward).append(b.forward_out);
  };
  auto const child_backward = [&](bool unit, int owner, std::size_t l, call_boundary const& b, cost const& inner) {
    gather(owner, l, unit && again);
    list.append(b.backward_out).append(inner.backward);
    if (unit) reduce(owner, l);
    list.append(b.backward_in);
  };
  for (std::size_t m = 0; m < t.microbatches; ++m) {
    gather(0, 0, true);
    list.append(parts.embedding.forward);
    for (std::size_t l = 0; l < c.layers; ++l) {
      gather(1, l, u.block);
      list.append(around_block.forward_in);
      child_forward(u.attention, 2, l, around_attention, attention);
      child_forward(u.feed_forward, 3, l, around_feed_forward, feed_forward);
      list.append(around_block.forward_out);
    }
    list.append(parts.output.forward).append(loss.forward).append(parts.head_backward);
    for (std::size_t l = c.layers; l-- > 0;) {
      gather(1, l, u.block && again);
      list.append(around_block.backward_out);
      child_backward(u.feed_forward, 3, l, around_feed_forward, feed_forward);
      child_backward(u.attention, 2, l, around_attention, attention);
      if (u.block) reduce(1, l);
      list.append(around_block.backward_in);
    }
    list.append(parts.embedding.backward);
    reduce(0, 0);
  }
  if (parallelized) list.add(transfer_kind::all_reduce, t.tp.tp_axis, sizeof(T));  // the squared norm over tp
  if (sharded) list.add(transfer_kind::all_reduce, t.dp_axis, sizeof(T));          // and over dp
  return list;
}

/// The transfers of llama_fsdp_step_cost; `parallelized`: the model's layers hold a tp group (the norm's squares
/// are summed over it).
template <class T, class Strategy, class Plan, std::size_t Capacity>
constexpr transfer_list<Capacity> llama_fsdp_transfers(LlamaConfig const& c, training_step_inputs const& t,
                                                       fsdp_element_sizes e, fsdp_cost_options const& o,
                                                       bool parallelized) {
  using Model = Llama<T, Plan>;
  using Logits = typename decltype(std::declval<Model&>().output)::output_layout;
  constexpr bool sharded = !std::is_same_v<Strategy, no_shard>;
  constexpr bool again = std::is_same_v<Strategy, full_shard>;  // gathered again for the backward
  constexpr int root = 0, block = 1;  // the blocks are alike: layer 0's parameters stand for each
  llama_block_units const u{true, false, false};
  llama_cost_parts const parts = Model::shardwise_cost_parts(c, t.tp);
  cost const loss = cross_entropy_cost<T, Logits>(t.tp.tokens, t.tp);
  transfer_list<Capacity> list;
  auto const gathers = [&](int owner, bool when) {
    if (sharded && when) add_unit_gathers<Model>(list, c, t, u, owner, 0, e);
  };
  std::size_t const layers = c.layers;
  for (std::size_t m = 0; m < t.microbatches; ++m) {
    gathers(root, true);
    gathers(block, o.forward_prefetch && layers > 0);  // the first block's, started with the root's
    list.append(parts.embedding.forward);
    for (std::size_t l = 0; l < layers; ++l) {
      gathers(block, o.forward_prefetch ? l + 1 < layers : true);  // prefetch: the next block's
      list.append(parts.block.forward);
    }
    list.append(parts.output.forward).append(loss.forward).append(parts.head_backward);
    for (std::size_t l = 0; l < layers; ++l) {  // blocks in reverse; l counts from the last
      gathers(block, again && (!o.backward_prefetch || l == 0));
      // A checkpointed block runs its forward again first; its backward hook then starts the next gather.
      if (o.checkpointed_blocks) list.append(parts.block.forward);
      gathers(block, again && o.backward_prefetch && l + 1 < layers);  // the next block's, started ahead
      list.append(parts.block.backward);
      add_unit_reductions<Model>(list, c, t, u, block, 0, sharded, e, o);
    }
    list.append(parts.embedding.backward);
    add_unit_reductions<Model>(list, c, t, u, root, 0, sharded, e, o);
  }
  if (parallelized) list.add(transfer_kind::all_reduce, t.tp.tp_axis, sizeof(T));  // the squared norm over tp
  if (sharded) list.add(transfer_kind::all_reduce, t.dp_axis, sizeof(T));          // and over dp
  return list;
}

}  // namespace detail

/// The transfers of one training step of Llama<T, Plan> under sw::fully_shard<fsdp_policy<Strategy,
/// wrap_paths<"layers.*">, Precision>> (or wrap_type of its block: the same units) on a dp x tp mesh (the model
/// given to sw::parallelize over tp, or the 2-D mesh given to fully_shard), in the order they run on this rank:
/// `t.microbatches` forward and backward passes, then AdamW's step. Per microbatch: the root unit (tok_embeddings,
/// norm, output) gathered; the embedding's forward; each block gathered, then its forward; the output's forward
/// and the loss's. Backward: the output's; each block in reverse — gathered again (full shard), its backward (its
/// forward first, with `o.checkpointed_blocks`), its gradients finished over tp and reduced over dp (and, hybrid,
/// averaged over the replicas) —; the embedding's backward; the root's gradients finished and reduced. Then the
/// clipping norm's squares summed over tp and dp (no_shard: over tp). Prefetch moves each block's gathers to the
/// start of the block before it in the pass. Gathers move Precision's param_type, reductions its reduce_type.
template <class T, class Strategy, class Plan, class Precision = full_precision, std::size_t Capacity = 1024>
constexpr transfer_list<Capacity> llama_fsdp_step_cost(LlamaConfig const& c, training_step_inputs const& t,
                                                       fsdp_cost_options const& o = {}) {
  if (o.wrap != llama_fsdp_wrap::blocks && (o.forward_prefetch || o.backward_prefetch || o.checkpointed_blocks))
    shardwise::raise(
        "shardwise::models::llama_fsdp_step_cost: prefetch and checkpointed blocks are predicted with "
        "one unit per block only (llama_fsdp_wrap::blocks); leave them off for other wrap policies");
  if (o.wrap != llama_fsdp_wrap::blocks)
    return detail::llama_fsdp_transfers_by_module<T, Strategy, Plan, Capacity>(c, t, detail::fsdp_sizes<T, Precision>(),
                                                                               o, true);
  return detail::llama_fsdp_transfers<T, Strategy, Plan, Capacity>(c, t, detail::fsdp_sizes<T, Precision>(), o, true);
}

/// The transfers on the dp axis (`dp` ranks, this rank `dp_rank`) of one training step of Llama<T> (tp 1) under
/// sw::fully_shard<fsdp_policy<Strategy, wrap_paths<"layers.*">>> with `microbatches` forward and backward
/// passes, then AdamW's step. Per microbatch: the root unit (tok_embeddings, norm, output) gathered, each block
/// gathered in order for the forward; in the backward each block in reverse — gathered again under full shard —
/// and its gradients reduce-scattered, then the root's. Then the clipping norm's all-reduce over dp. no_shard
/// gathers nothing and all-reduces each gradient; its norm needs no all-reduce. The list holds `Capacity` runs:
/// about 6 + 18 x layers per microbatch under full shard (a run merges equal consecutive calls); the default
/// fits 56 layers at one microbatch, and too small a capacity throws naming it.
template <class T, class Strategy = full_shard, std::size_t Capacity = 1024>
constexpr transfer_list<Capacity> llama_fsdp_step_cost(LlamaConfig const& c, std::size_t dp, std::size_t dp_rank,
                                                       std::size_t microbatches = 1, std::string_view axis = "dp") {
  training_step_inputs const t{{1, 1, 0, "tp"}, microbatches, dp, dp_rank, false, axis};
  return detail::llama_fsdp_transfers<T, Strategy, serial_plan, Capacity>(c, t, {sizeof(T), sizeof(T)}, {}, false);
}

}  // namespace shardwise::models

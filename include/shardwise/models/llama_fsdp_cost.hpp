#pragma once
// The transfers of a Llama training step under FSDP (sw::fully_shard with each block a unit, as torchtitan
// wraps: fsdp_policy<Strategy, wrap_paths<"layers.*">>), alone on a dp mesh or with tensor parallelism: every
// parameter's gather and gradient reduction in the order fully_shard runs them, between the layers' own tp
// transfers, from the model's parameter walk (this tp rank's rows, cut by torch.chunk over dp).
#include <array>
#include <cstddef>
#include <string_view>
#include <type_traits>

#include "shardwise/cost/cost.hpp"
#include "shardwise/cost/transfer.hpp"
#include "shardwise/fsdp/policy.hpp"
#include "shardwise/models/llama.hpp"
#include "shardwise/placement/chunk.hpp"

namespace shardwise::models {

namespace detail {

/// One unit's parameters as FSDP walks them: (at most) one block's nine, or the root's three.
struct fsdp_unit_costs {
  std::array<parameter_cost, 9> parameters{};  ///< In walk order.
  std::size_t count = 0;                       ///< How many are present.
};

/// The root unit's and one block's parameters of Llama<T, Plan> on this tp rank, from its parameter walk.
template <class Model>
constexpr std::array<fsdp_unit_costs, 2> fsdp_units(LlamaConfig const& c, cost_inputs const& s) {
  std::array<fsdp_unit_costs, 2> units{};  // root, block
  std::size_t index = 0;
  Model::shardwise_parameter_costs(c, s, [&](parameter_cost const& p) {
    bool const in_block = index >= 1 && index < 1 + 9 * c.layers;
    fsdp_unit_costs& u = units[in_block ? 1 : 0];
    if (!in_block || index < 10) u.parameters[u.count++] = p;
    ++index;
  });
  return units;
}

/// Appends each parameter's dp transfer: an all-gather of this rank's rows, or a reduce-scatter or all-reduce of
/// the whole gradient (this tp rank's).
template <std::size_t Capacity>
constexpr void add_unit(transfer_list<Capacity>& list, transfer_kind kind, fsdp_unit_costs const& u,
                        training_step_inputs const& t) {
  for (std::size_t i = 0; i < u.count; ++i) {
    parameter_cost const& p = u.parameters[i];
    std::size_t const cols = p.elements / p.rows;
    std::size_t const rows = kind == transfer_kind::all_gather ? chunk_size(p.rows, t.dp, t.dp_rank) : p.rows;
    list.add(kind, t.dp_axis, rows * cols * p.element_size);
  }
}

/// Appends what a unit's backward ends with: each gradient finished over tp (sw::finish_gradients' step for that
/// parameter), then each reduced over dp.
template <std::size_t Capacity>
constexpr void add_unit_reduction(transfer_list<Capacity>& list, transfer_kind reduce, fsdp_unit_costs const& u,
                                  training_step_inputs const& t) {
  list.append(finish_gradients_cost<Capacity>(
      [&](auto&& fn) {
        for (std::size_t i = 0; i < u.count; ++i) fn(u.parameters[i]);
      },
      t.tp));
  add_unit(list, reduce, u, t);
}

/// The transfers of llama_fsdp_step_cost; `parallelized`: the model's layers hold a tp group (the norm's squares
/// are summed over it).
template <class T, class Strategy, class Plan, std::size_t Capacity>
constexpr transfer_list<Capacity> llama_fsdp_transfers(LlamaConfig const& c, training_step_inputs const& t,
                                                       bool parallelized) {
  using Model = Llama<T, Plan>;
  using Logits = typename decltype(std::declval<Model&>().output)::output_layout;
  constexpr bool sharded = !std::is_same_v<Strategy, no_shard>;
  constexpr transfer_kind reduce = sharded ? transfer_kind::reduce_scatter : transfer_kind::all_reduce;
  auto const [root, block] = detail::fsdp_units<Model>(c, t.tp);
  llama_cost_parts const parts = Model::shardwise_cost_parts(c, t.tp);
  cost const loss = cross_entropy_cost<T, Logits>(t.tp.tokens, t.tp);
  transfer_list<Capacity> list;
  for (std::size_t m = 0; m < t.microbatches; ++m) {
    if constexpr (sharded) detail::add_unit(list, transfer_kind::all_gather, root, t);
    list.append(parts.embedding.forward);
    for (std::size_t l = 0; l < c.layers; ++l) {
      if constexpr (sharded) detail::add_unit(list, transfer_kind::all_gather, block, t);
      list.append(parts.block.forward);
    }
    list.append(parts.output.forward).append(loss.forward).append(parts.head_backward);
    for (std::size_t l = 0; l < c.layers; ++l) {
      if constexpr (std::is_same_v<Strategy, full_shard>) detail::add_unit(list, transfer_kind::all_gather, block, t);
      list.append(parts.block.backward);
      detail::add_unit_reduction(list, reduce, block, t);
    }
    list.append(parts.embedding.backward);
    detail::add_unit_reduction(list, reduce, root, t);
  }
  if (parallelized) list.add(transfer_kind::all_reduce, t.tp.tp_axis, sizeof(T));    // the squared norm over tp
  if constexpr (sharded) list.add(transfer_kind::all_reduce, t.dp_axis, sizeof(T));  // and over dp
  return list;
}

}  // namespace detail

/// The transfers of one training step of Llama<T, Plan> under sw::fully_shard<fsdp_policy<Strategy,
/// wrap_paths<"layers.*">>> on a dp x tp mesh (the model given to sw::parallelize over tp, or the 2-D mesh given
/// to fully_shard), in the order they run on this rank, `t.microbatches` forward and backward passes, then AdamW's
/// step. Per microbatch: the root unit (tok_embeddings, norm, output) gathered; the embedding's forward; each block
/// gathered, then its forward; the output's forward and the loss's. Backward: the output's; each block in reverse
/// gathered again (full shard), its backward, its gradients finished over tp and reduced over dp; the embedding's
/// backward; the root's gradients finished and reduced. Then the clipping norm's squares summed over tp and dp
/// (no_shard: over tp). Without prefetch (which starts the next unit's gathers before the current unit's
/// forward or backward transfers) and without activation checkpointing.
template <class T, class Strategy, class Plan, std::size_t Capacity = 1024>
constexpr transfer_list<Capacity> llama_fsdp_step_cost(LlamaConfig const& c, training_step_inputs const& t) {
  return detail::llama_fsdp_transfers<T, Strategy, Plan, Capacity>(c, t, true);
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
  return detail::llama_fsdp_transfers<T, Strategy, serial_plan, Capacity>(c, t, false);
}

}  // namespace shardwise::models

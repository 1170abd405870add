#pragma once
// The transfers of a pipeline step of Llama stages under FSDP (sw::run_pipeline_step over sw::fully_shard of a
// rank's LlamaStage, each block a unit: fsdp_policy<full_shard, wrap_paths<"layers.*">>), in the order they run
// on one rank: the pipeline's own (pipeline_step_cost, read off the schedule's table) with the units' gathers and
// reductions where the sharded model's hooks run them, then AdamW::step(sharded, pp)'s norm.
#include <cstddef>
#include <string_view>
#include <type_traits>

#include "shardwise/cost/transfer.hpp"
#include "shardwise/models/llama_fsdp_cost.hpp"
#include "shardwise/models/llama_stage.hpp"
#include "shardwise/pipeline/cost.hpp"
#include "shardwise/pipeline/run.hpp"

namespace shardwise::models {

namespace detail {

/// Calls fn(p) for each parameter of the stage's root unit (what no block holds: the embedding on the first stage,
/// the final norm and the output on the last, a tied table's copy included), in walk order.
template <class Stage, class Fn>
constexpr void for_stage_root_parameters(LlamaConfig const& c, stage_range const& blocks, cost_inputs const& s,
                                         Fn&& fn) {
  auto const shapes = Stage::shardwise_shapes(c, blocks, s.tp);
  parameter_costs<decltype(std::declval<Stage&>().tok_embeddings)>(std::get<0>(shapes), s, fn);
  parameter_costs<decltype(std::declval<Stage&>().norm)>(std::get<2>(shapes), s, fn);
  parameter_costs<decltype(std::declval<Stage&>().output)>(std::get<3>(shapes), s, fn);
}

/// A unit's gradients finished over tp (`finish`) and reduce-scattered over dp (`reduce`), its parameters walked
/// by `walk(fn)`.
template <std::size_t Capacity, class Walk>
constexpr void add_stage_unit_reductions(transfer_list<Capacity>& list, Walk const& walk, training_step_inputs const& t,
                                         bool finish, bool reduce) {
  if (finish) list.append(finish_gradients_cost<Capacity>(walk, t.tp));
  if (reduce)
    walk([&](parameter_cost const& p) { add_reduction(list, true, p, t, {sizeof(float), sizeof(float)}, {}); });
}

}  // namespace detail

/// What one LlamaStage<T, Plan> of the blocks `blocks` does per microbatch and per step under full-shard FSDP with
/// a unit per block (sw::stage_transfers, for sw::pipeline_step_cost): before the step the root unit gathered;
/// each forward the embedding's (first stage), each block gathered then run, the head and its loss (last stage);
/// each backward each block in reverse gathered again and run, its gradients finished over tp and, with
/// `every_microbatch`, reduce-scattered over dp, then the embedding's (first stage); after the step the tied
/// tables' exchange over `pp_axis`, the blocks' reductions left for the end, and the root's. T is float.
template <class T, class Plan, std::size_t N = 64>
constexpr stage_transfers<N> llama_fsdp_stage_transfers(LlamaConfig const& c, stage_range const& blocks,
                                                        training_step_inputs const& t,
                                                        sharded_gradient_reduction reduction,
                                                        std::string_view pp_axis = "pp") {
  static_assert(std::is_same_v<T, float>, "shardwise::models::llama_fsdp_stage_transfers: float stages only");
  using Stage = LlamaStage<T, Plan>;
  using Output = std::remove_cvref_t<decltype(*std::declval<Stage&>().output)>;
  bool const first = blocks.first == 0, last = blocks.first + blocks.count == c.layers;
  bool const every = reduction == sharded_gradient_reduction::every_microbatch;
  llama_cost_parts const parts = Llama<T, Plan>::shardwise_cost_parts(c, t.tp);
  auto const block = [&](auto&& fn) {
    detail::for_unit_parameters<Llama<T, Plan>>(c, t.tp, {true, false, false}, 1, 0, fn);
  };
  auto const root = [&](auto&& fn) { detail::for_stage_root_parameters<Stage>(c, blocks, t.tp, fn); };
  auto const gather = [&](transfer_list<N>& list, auto const& walk) {
    walk([&](parameter_cost const& p) { detail::add_gather(list, p, t, {sizeof(T), sizeof(T)}); });
  };
  stage_transfers<N> s;
  gather(s.before_step, root);
  if (first) s.forward.append(parts.embedding.forward);
  for (std::size_t i = 0; i < blocks.count; ++i) {
    gather(s.forward, block);
    s.forward.append(parts.block.forward);
    gather(s.backward, block);
    s.backward.append(parts.block.backward);
    detail::add_stage_unit_reductions(s.backward, block, t, true, every);
  }
  if (last)
    s.forward.append(parts.output.forward)
        .append(cross_entropy_cost<T, typename Output::output_layout>(t.tp.tokens, t.tp).forward)
        .append(parts.head_backward);
  if (first) s.backward.append(parts.embedding.backward);
  s.after_step.append(Stage::shardwise_pipeline_transfers(c, blocks, t.tp, false, false, pp_axis).after_step);
  for (std::size_t i = 0; i < blocks.count && !every; ++i)
    detail::add_stage_unit_reductions(s.after_step, block, t, false, true);
  detail::add_stage_unit_reductions(s.after_step, root, t, true, true);
  return s;
}

/// The transfers of rank `rank`'s part of one step of `schedule` over `stages` ranks and `microbatches`
/// microbatches, its stage (one chunk per rank) the blocks `blocks` of Llama<T, Plan> under full-shard FSDP with
/// a unit per block, then AdamW::step(sharded, pp)'s norm (its squares summed over tp, dp and pp): in the order
/// the run makes them (models::llama_fsdp_stage_transfers says what each action adds).
template <class T, class Plan, std::size_t Capacity = 512, pipeline_schedule Schedule>
constexpr transfer_list<Capacity> llama_fsdp_pipeline_step_cost(Schedule const& schedule, LlamaConfig const& c,
                                                                stage_range const& blocks, int stages, int rank,
                                                                int microbatches, training_step_inputs const& t,
                                                                sharded_gradient_reduction reduction,
                                                                std::string_view pp_axis = "pp") {
  static_assert(Schedule::chunks_per_rank == 1,
                "shardwise::models::llama_fsdp_pipeline_step_cost: one chunk per rank (no interleaving) only");
  using Stream = typename LlamaStage<T, Plan>::stream;
  bool const cut = std::is_same_v<typename Stream::placement, Shard<0>>;  // the stream crossing the stages
  std::size_t const boundary = (cut ? t.tp.local_tokens() : t.tp.tokens) * c.dim * sizeof(T);
  auto list =
      pipeline_step_cost<Capacity>(schedule, stages, rank, microbatches, boundary,
                                   llama_fsdp_stage_transfers<T, Plan>(c, blocks, t, reduction, pp_axis), pp_axis);
  list.add(transfer_kind::all_reduce, t.tp.tp_axis, sizeof(T))  // the norm's squares over tp, dp, then pp
      .add(transfer_kind::all_reduce, t.dp_axis, sizeof(T))
      .add(transfer_kind::all_reduce, pp_axis, sizeof(T));
  return list;
}

}  // namespace shardwise::models

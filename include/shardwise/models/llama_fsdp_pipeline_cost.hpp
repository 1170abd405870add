#pragma once
// The transfers of a pipeline step of Llama stages under FSDP (sw::run_pipeline_step over sw::fully_shard of a
// rank's LlamaStage, each block a unit: fsdp_policy<full_shard, wrap_paths<"layers.*">>), in the order they run
// on one rank: the pipeline's own (pipeline_step_cost, read off the schedule's table) with what the stage's code
// and fully_shard's schedule do at each action (sw::fsdp_stage_transfers), then AdamW::step(sharded, pp)'s norm.
#include <cstddef>
#include <string_view>
#include <type_traits>

#include "shardwise/cost/transfer.hpp"
#include "shardwise/fsdp/step_cost.hpp"
#include "shardwise/models/llama_stage.hpp"
#include "shardwise/pipeline/cost.hpp"
#include "shardwise/pipeline/run.hpp"

namespace shardwise::models {

/// What one LlamaStage<T, Plan> of the blocks `blocks` does per microbatch and per step under full-shard FSDP with
/// a unit per block (sw::stage_transfers, for sw::pipeline_step_cost), derived by sw::fsdp_stage_transfers from
/// the stage's code: before the step the root unit gathered; each forward the embedding's (first stage), each
/// block gathered then run, the head and its loss (last stage); each backward each block in reverse gathered
/// again and run, its gradients finished over tp and, with `every_microbatch`, reduced over dp, then the
/// embedding's (first stage); after the step the tied tables' exchange over `pp_axis`, the blocks' reductions
/// left for the end, and the root's.
template <class T, class Plan, std::size_t N = 64>
stage_transfers<N> llama_fsdp_stage_transfers(LlamaConfig const& c, stage_range const& blocks,
                                              training_step_inputs const& t, sharded_gradient_reduction reduction,
                                              std::string_view pp_axis = "pp") {
  using Stage = LlamaStage<T, Plan>;
  using Shapes = typename Stage::shapes_type;
  fsdp_step_inputs const step{t.tp, t.microbatches, t.dp, t.dp_rank, t.dp_axis};
  transfer_list<N> exchange;
  exchange.append(Stage::shardwise_pipeline_transfers(c, blocks, t.tp, false, false, pp_axis).after_step);
  return fsdp_stage_transfers<fsdp_policy<full_shard, wrap_paths<"layers.*">>, Shapes, typename Shapes::stream, N>(
      step, c.dim, reduction == sharded_gradient_reduction::every_microbatch, exchange, [](Shapes&) {}, c, blocks,
      Stage::stages_around(c, blocks));
}

/// The transfers of rank `rank`'s part of one step of `schedule` over `stages` ranks and `microbatches`
/// microbatches, its stage (one chunk per rank) the blocks `blocks` of Llama<T, Plan> under full-shard FSDP with
/// a unit per block, then AdamW::step(sharded, pp)'s norm (its squares summed over tp, dp and pp): in the order
/// the run makes them (models::llama_fsdp_stage_transfers says what each action adds).
template <class T, class Plan, std::size_t Capacity = 512, pipeline_schedule Schedule>
transfer_list<Capacity> llama_fsdp_pipeline_step_cost(Schedule const& schedule, LlamaConfig const& c,
                                                      stage_range const& blocks, int stages, int rank, int microbatches,
                                                      training_step_inputs const& t,
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

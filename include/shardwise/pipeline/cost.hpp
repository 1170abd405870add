#pragma once
// The cost of a pipeline step (sw::run_pipeline_step) as a transfer list: read off the schedule's own action
// table, so the prediction and the run cannot disagree on the order. Each send and receive between ranks moves
// one microbatch's boundary activation or its gradient; each forward and backward adds the stage chunk's own
// transfers (its tensor-parallel ones, from the chunk's declared cost).
#include <cstddef>

#include "shardwise/cost/transfer.hpp"
#include "shardwise/pipeline/schedules.hpp"
#include "shardwise/pipeline/step_terms.hpp"

namespace shardwise {

/// What one stage chunk sends per microbatch besides the pipeline's own sends: its forward's and its backward's
/// transfers (the forward and backward lists of the chunk's sw::cost; empty when its other axes are size 1).
template <std::size_t N = 48>
struct stage_transfers {
  transfer_list<N> forward;   ///< One microbatch's forward through the chunk.
  transfer_list<N> backward;  ///< One microbatch's backward through it.
  /// What runs again before each backward under stage-level recomputation (pipeline_options' activations =
  /// stage_activations::recompute): the forward's transfers but those of what ran once after it (a loss); empty
  /// when the stage keeps its activations.
  transfer_list<N> recompute;
  /// What the chunk sends once at the step's end (its shardwise_after_pipeline_step: tied embeddings' exchange;
  /// under FSDP then the gradients reduced at the end).
  transfer_list<N> after_step;
  /// What runs once before the step's first action (under FSDP: the root unit's gather).
  transfer_list<N> before_step;
};

/// The transfers of rank `rank`'s part of one pipeline step of `schedule` over `stages` ranks and `microbatches`
/// microbatches, in its action table's order: first the gather in which the ranks agree on the step and `chunk`'s
/// before_step, then a send or receive of `boundary_bytes` (one microbatch's boundary activation on this rank, as
/// its gradient) for each action whose peer is another rank, on mesh axis `axis`; `chunk`'s transfers for each
/// forward and backward (its recomputation's first), and its after_step at the end. The optimizer step after
/// run_pipeline_step adds its own.
template <std::size_t Capacity = 128, pipeline_schedule Schedule, std::size_t N = 48>
transfer_list<Capacity> pipeline_step_cost(Schedule const& schedule, int stages, int rank, int microbatches,
                                           std::size_t boundary_bytes, stage_transfers<N> const& chunk = {},
                                           axis_label axis = "pp") {
  transfer_list<Capacity> list;
  list.add(transfer_kind::gather_values, axis, sizeof(detail::pipeline_step_terms));  // the step's terms agreed
  list.append(chunk.before_step);
  for (pipeline_action const& a : schedule.actions(rank, stages, microbatches)) {
    switch (a.kind) {
      case action_kind::forward:
        list.append(chunk.forward);
        break;
      case action_kind::backward:
      case action_kind::backward_input:  // every transfer of the backward is B's: W computes locally
        list.append(chunk.recompute).append(chunk.backward);
        break;
      case action_kind::backward_weight:
        break;
      case action_kind::send_activation:
      case action_kind::send_gradient:
        if (a.peer != rank) list.add(transfer_kind::send, axis, boundary_bytes);
        break;
      case action_kind::recv_activation:
      case action_kind::recv_gradient:
        if (a.peer != rank) list.add(transfer_kind::recv, axis, boundary_bytes);
        break;
    }
  }
  return list.append(chunk.after_step);
}

}  // namespace shardwise

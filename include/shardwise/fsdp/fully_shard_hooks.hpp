#pragma once
// What a fully sharded model's schedule (fsdp/schedule.hpp) does to a unit, defined apart from the class
// (fsdp/fully_shard.hpp): its gathers started and finished, its gathered parameters freed, its gradients finished
// over tp and averaged over dp, and the whole matrices a full-shard step keeps for reuse managed at the step's
// moments.
#include <cstddef>
#include <type_traits>

#include "shardwise/core/error.hpp"
#include "shardwise/fsdp/fully_shard.hpp"

namespace shardwise {

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::gather(detail::fsdp_unit& u) {
  for (auto i : u.slots) gather_slot<param_type>(slots_[i]).wait();  // one at a time: one slot's staging at once
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::start_gather(detail::fsdp_unit& u) {
  auto& pending = in_flight_[schedule_.index_of(u)];
  for (auto i : u.slots) pending.push_back(gather_slot<param_type>(slots_[i]));
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::finish_gather(detail::fsdp_unit& u) {
  auto& pending = in_flight_[schedule_.index_of(u)];
  for (auto& gather : pending) gather.wait();
  pending.clear();
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::reuse_gradients(detail::fsdp_unit& u) {
  for (auto i : u.slots) slots_[i].reuse_grad();
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::at(detail::fsdp_moment moment) {
  using detail::fsdp_moment;
  constexpr bool frees = std::is_same_v<strategy, full_shard>;  // the one strategy that frees within a step
  switch (moment) {
    case fsdp_moment::forward_starting:
      spare_->active = false;  // what is released now (unshard's tensors) is freed, not handed along
      break;
    case fsdp_moment::forward_units_released:
      spare_->end_pass();  // a pass that threw may have kept gradients
      spare_->active = frees;
      spare_->reused_bytes = 0;
      break;
    case fsdp_moment::unit_started:  // what this unit (and its prefetch) did not take: other shapes, not kept
    case fsdp_moment::last_backward_unit_finished:  // not kept through the root's reduce-scatter
      spare_->spare.clear();
      break;
    case fsdp_moment::last_forward_unit_released:  // no unit of this pass takes what it released
    case fsdp_moment::pass_ended:
      spare_->end_pass();
      break;
    case fsdp_moment::backward_starting:
      spare_->end_pass();
      spare_->active = frees;
      break;
    case fsdp_moment::pipeline_starting:
      spare_->stop();  // nothing kept or reused: passes of several microbatches interleave
      break;
  }
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::refuse_unfilled() const {
  if (unfilled_)
    detail::fail(
        "shardwise::fully_shard: the model was declared with sw::Lazy and its shards hold no values yet; fill "
        "them with sw::load_sharded or sw::load_consolidated before its forward");
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::check_placed_experts() const {
  expert_parallel const* placed = detail::experts_placement(model_);
  auto const places = detail::gather_values(
      dp_.comm(0), std::array<int, 3>{placed != nullptr, placed ? placed->rank() : 0, placed ? placed->replica() : 0});
  if (std::none_of(places.begin(), places.end(), [](auto const& q) { return q[0] != 0; })) return;
  bool same = std::all_of(places.begin(), places.end(), [](auto const& q) { return q[0] != 0; }) && placed &&
              placed->size() * placed->replicas() == dp_.size(0);
  for (std::size_t a = 0; same && a < places.size(); ++a)  // each (ep rank, replica) once
    for (std::size_t b = a + 1; b < places.size(); ++b)
      same = same && (places[a][1] != places[b][1] || places[a][2] != places[b][2]);
  if (!same)
    detail::fail(
        "shardwise::fully_shard: the model's experts are placed (sw::expert_parallelize) over ep ranks that "
        "are not the ranks of data-parallel mesh axis \"",
        dp_.comm(0).label(), "\" (", dp_.size(0),
        " ranks) with their replicas; each expert is cut over the ranks that hold it: place the experts over "
        "an \"ep\" axis with their replicas over \"edp\", sw::expert_parallelize(model, ep, edp), of one mesh "
        "of \"edp\" x \"ep\" ranks that are the dp ranks");
  if (!sharded || !std::is_same_v<param_type, scalar> || !std::is_same_v<reduce_type, scalar> ||
      !std::is_same_v<ReplicateMesh, no_replication>)
    detail::fail(
        "shardwise::fully_shard: the model's experts are placed over ep ranks (sw::expert_parallelize); "
        "they are sharded under full_shard or shard_grad_op, in full precision, without hybrid sharding: "
        "use that policy, or shard a model whose experts are not placed");
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::refuse_unreduced_gradients() const {
  for (auto const& u : units())
    if (u.unreduced)
      detail::fail("shardwise::fully_shard: the unit \"", u.path,
                   "\" holds gradients that were not reduced over data parallelism "
                   "(set_requires_gradient_sync(false)); turn gradient sync on for the last backward (or the last "
                   "pipeline step) before the optimizer step");
}

}  // namespace shardwise

#pragma once
// A fully sharded model's hooks, defined apart from the class (fsdp/fully_shard.hpp): what sw::forward and
// sw::backward run around a unit's module (gather it; under full_shard release it after its forward; after its
// backward reduce-scatter its gradients, or keep them whole without gradient sync), and the model driven by
// sw::run_pipeline_step, whose step is the schedule's many forwards before their backwards, not one of each:
// the root unit stays gathered all step (the last stage's head runs outside any chunk's forward) and is reduced
// once at its end, and nothing is prefetched or handed along between units, whose passes interleave.
#include <cstddef>
#include <type_traits>

#include "shardwise/core/error.hpp"
#include "shardwise/fsdp/fully_shard.hpp"

namespace shardwise {

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::before_forward(detail::module_id module) {
  if (phase_ == phase::idle) return;  // a module called outside this model's passes
  if (auto* u = unit_of(module)) {
    gather(*u);
    u->called = true;
    if (phase_ != phase::forward) return;  // a recomputation in backward (activation checkpointing)
    if (pipelining_) {  // a schedule interleaves microbatches' passes: no prefetch, no storage handed along
      ++u->forwards;
      return;
    }
    forward_order_.push_back(index_of(*u));
    if (options_.forward_prefetch) prefetch(next_in_forward(index_of(*u)));
    spare_->spare.clear();  // what this unit (and its prefetch) did not take: other shapes, not kept waiting
  }
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::after_forward(detail::module_id module) {
  if (phase_ == phase::idle) return;  // a module called outside this model's passes
  if (auto* u = unit_of(module); u && phase_ == phase::forward && std::is_same_v<strategy, full_shard>) {
    release(*u);
    if (!next_in_forward(index_of(*u))) spare_->end_pass();  // no unit of this pass takes what it released
  }
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::before_backward(detail::module_id module) {
  if (phase_ == phase::idle) return;  // a module called outside this model's passes
  if (auto* u = unit_of(module)) {
    gather(*u);
    for (auto i : u->slots) slots_[i].reuse_grad();
    if (pipelining_) return;
    if (options_.backward_prefetch) prefetch(next_in_backward(index_of(*u)));
    spare_->spare.clear();  // what this unit (and its prefetch) did not take: other shapes, not kept waiting
  }
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::after_backward(detail::module_id module) {
  if (phase_ == phase::idle) return;  // a module called outside this model's passes
  if (auto* u = unit_of(module)) {
    if (sync_ && (!pipelining_ || reduce_every_microbatch_)) {
      reduce_gradients(*u);
    } else {
      if (pipelining_) finish_gradients_of(*u);  // finished while gathered; the step's end reduces them
      u->unreduced = true;
    }
    release(*u);
    if (pipelining_) {
      ++u->backwards;
      return;
    }
    if (!next_in_backward(index_of(*u))) spare_->spare.clear();  // not kept through the root's reduce-scatter
    u->reduced = true;
  }
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::finish_root() {
  if (sync_)
    reduce_gradients(units_[0]);
  else
    units_[0].unreduced = true;
  release(units_[0]);
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::finish_backward() {
  finish_prefetches();
  finish_root();  // its parameters' storage kept for the next forward's first gather
  spare_->end_pass();
  phase_ = phase::idle;
  for (std::size_t i = 1; i < units_.size(); ++i)
    if (units_[i].called && !units_[i].reduced)
      detail::fail(
          "shardwise::fully_shard: the unit \"", units_[i].path,
          "\" ran forward but its gradients were not reduced: call it as sw::backward(module, dy) in the model's "
          "backward");
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::shardwise_pipeline_begin(bool every_microbatch) {
  refuse_unfilled();
  spare_->stop();  // nothing kept or reused: passes of several microbatches interleave
  finish_prefetches();
  for (auto& u : units_) {
    release(u);
    u.called = u.reduced = false;
    u.forwards = u.backwards = 0;
  }
  pipelining_ = true;
  reduce_every_microbatch_ = every_microbatch;
  phase_ = phase::forward;
  gather(units_[0]);
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::shardwise_pipeline_end() {
  shardwise_pipeline_abandon();
  for (std::size_t i = 1; i < units_.size(); ++i)
    if (units_[i].unreduced && sync_) reduce_finished_gradients(units_[i]);  // finished after each backward
  finish_root();
  for (std::size_t i = 1; i < units_.size(); ++i)
    if (units_[i].forwards != units_[i].backwards || units_[i].forwards == 0)
      detail::fail("shardwise::run_pipeline_step: the unit \"", units_[i].path, "\" of the fully sharded stage ran ",
                   units_[i].forwards, " forwards and ", units_[i].backwards,
                   " backwards in the step; call it as sw::forward(module, x) in the stage's forward and "
                   "sw::backward(module, dy) in its backward, once each per microbatch");
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::refuse_unfilled() const {
  if (unfilled_)
    detail::fail(
        "shardwise::fully_shard: the model was declared with sw::Lazy and its shards hold no values yet; fill "
        "them with sw::load_sharded or sw::load_consolidated before its forward");
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::refuse_unreduced_gradients() const {
  for (auto const& u : units_)
    if (u.unreduced)
      detail::fail("shardwise::fully_shard: the unit \"", u.path,
                   "\" holds gradients that were not reduced over data parallelism "
                   "(set_requires_gradient_sync(false)); turn gradient sync on for the last backward (or the last "
                   "pipeline step) before the optimizer step");
}

}  // namespace shardwise

#pragma once
// A fully sharded model's units and slots, defined apart from the class (fsdp/fully_shard.hpp): how sw::fully_shard
// sets a model up — its units (the modules the wrap policy picks, or wrap_min_params' modules that reach the
// threshold) and one slot per parameter (this rank's shard of it and of its gradient, and how to resize, finish and
// clear the layer's tensors) — and what a step does with a unit's slots: gather, release, reduce the gradients.
#include <Eigen/Core>
#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "shardwise/fsdp/fully_shard.hpp"

namespace shardwise {

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::make_slots() {
  std::vector<std::size_t> sizes;
  detail::for_each_named_layer(model_, [&](auto& l, std::string const& path) {
    bool lazy = false;
    if constexpr (requires { l.shardwise_materialize(); })
      if (!l.materialized()) l.shardwise_materialize(), lazy = unfilled_ = true;
    std::size_t const first = slots_.size();
    auto make = [&](std::string const& name, auto const& p) { make_slot_of(name, p, sizes); };
    detail::for_each_present_parameter(l, path, make);
    if (lazy && keeps_master)  // no_shard in full precision: the layer's tensor is the only copy, kept
      for (std::size_t i = first; i < slots_.size(); ++i) (void)slots_[i].resize_value(false);
  });
  std::vector<std::string> names;
  for (auto const& slot : slots_) names.push_back(slot.name);
  detail::assign_fsdp_units(units(), candidates_, names, sizes, options_.min_num_params);
  for (std::size_t u = 1; u < units().size(); ++u)  // the stages exchange a tied weight's whole gradient at the end
    for (std::size_t i : units()[u].slots)
      if (slots_[i].mirror)
        detail::fail("shardwise::fully_shard: \"", slots_[i].name,
                     "\" is a pipeline stage's copy of a weight tied "
                     "across stages, but it lies in the unit \"",
                     units()[u].path,
                     "\", whose gradients are freed "
                     "before the stages exchange theirs; leave the tied layers in the root unit (wrap the blocks)");
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
template <class P>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::make_slot_of(std::string const& name, P const& p,
                                                                          std::vector<std::size_t>& sizes) {
  slots_.push_back(make_slot(name, p));
  // The whole parameter's size, as Accelerate's min_num_params counts it: this rank's tp shard times the group.
  using G = typename P::grad_placement;
  bool const cut = is_shard_v<G> && p.group;
  sizes.push_back(static_cast<std::size_t>(p.value->size()) * static_cast<std::size_t>(cut ? p.group->size() : 1));
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
template <class Tensor>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::broadcast_from_first(Tensor& value) {
  detail::broadcast_on(dp_.comm(0), value, 0);
  if constexpr (!std::is_same_v<ReplicateMesh, no_replication>) detail::broadcast_on(replicate_->comm(0), value, 0);
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
template <class P>
/// The slot of one parameter (see the declaration in fsdp/fully_shard.hpp).
auto fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::make_slot(std::string const& name, P const& p)
    -> detail::fsdp_slot<scalar> {
  using Tensor = typename P::tensor_type;
  using Finished = typename decltype(detail::finished_view(p))::grad_placement;
  detail::fsdp_slot<scalar> s;
  s.placed = p.placed_over;  // another expert on each ep rank: cut over the ranks holding the same ones
  // lazy: zeros everywhere; placed: the replicas of an expert are built alike (dp rank 0 holds other experts)
  if (options_.sync_module_states && !unfilled_ && !s.placed) broadcast_from_first(*p.value);
  s.name = name;
  s.rows = p.value->rows(), s.cols = p.value->cols();
  auto const ranks = static_cast<std::size_t>(!sharded ? 1 : s.placed ? s.placed->replicas() : dp_.size(0));
  auto const rank = static_cast<std::size_t>(!sharded ? 0 : s.placed ? s.placed->replica() : dp_.coordinate(0));
  s.first_row = static_cast<Eigen::Index>(chunk_offset(static_cast<std::size_t>(s.rows), ranks, rank));
  s.row_count = static_cast<Eigen::Index>(chunk_size(static_cast<std::size_t>(s.rows), ranks, rank));
  scalar const* mine = p.value->data() + s.first_row * s.cols;
  if (keeps_master) s.shard.assign(mine, mine + s.row_count * s.cols);
  s.frozen = detail::is_frozen(p);  // its layer computes no gradient for it: nothing to reduce or step
  if (!s.frozen) s.shard_grad.assign(static_cast<std::size_t>(s.row_count * s.cols), scalar(0));
  if (p.group) tp_group_ = p.group;
  s.mirror = !p.mirror_of.empty();  // a pipeline stage's copy of another stage's weight: counted there
  bool const counted = !s.mirror && (is_shard_v<Finished> || (p.group ? p.group->rank() : 0) == 0);
  s.norm_weight = counted ? scalar(1) / static_cast<scalar>(p.copies) : scalar(0);
  Tensor* value = p.value;
  Eigen::Index const rows = s.rows, cols = s.cols;
  constexpr bool kept = std::is_same_v<Tensor, nn::matrix<scalar>>;  // vectors: small, from the heap
  s.resize_value = [value, rows, cols, spare = spare_](bool whole) {
    // Freed to no rows and (for a matrix) no columns: a layer run on it by mistake fails its size check.
    if constexpr (kept) {
      if (!whole) {
        spare->keep(*value, true);
      } else if (value->rows() != rows || value->cols() != cols) {
        value->resize(0, 0);
        if (!spare->take(*value, rows, cols)) value->resize(rows, cols);
      }
    } else {
      value->resize(whole ? rows : 0, whole || Tensor::ColsAtCompileTime == 1 ? cols : 0);
    }
    return value->data();
  };
  s.finish = [p] { detail::finish_gradient(p); };
  s.mark_finished = [p] { detail::mark_copies_summed(p); };
  s.finished_grad = [p, rows, cols] {  // by the slot's shape: the value may be released already (pipeline steps)
    auto const finished = detail::finished_view(p);
    if (finished.grad->size() != rows * cols) finished.grad->setZero(rows, cols);
    return finished.grad->data();
  };
  s.clear_grad = [p, spare = spare_](bool free) {
    for (Tensor* g : {p.grad, p.reduced_into}) {
      if (!g) continue;
      if (!free)
        g->setZero();
      else if constexpr (kept)
        spare->keep(*g, false);
      else
        g->resize(0, Tensor::ColsAtCompileTime == 1 ? 1 : 0);
    }
  };
  s.reuse_grad = [] {};
  if (s.frozen) return s;
  if constexpr (kept)
    s.reuse_grad = [p, rows, cols, spare = spare_] {
      if (p.grad->size() == 0 && spare->take(*p.grad, rows, cols)) p.grad->setZero();
    };
  return s;
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
template <class Param>
pending_collective fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::gather_slot(detail::fsdp_slot<scalar>& s) {
  scalar* const whole = s.resize_value(true);
  if constexpr (!keeps_master) return {};  // no_shard in full precision: the layer's tensor is the shard
  Eigen::Map<nn::matrix<scalar>> out(whole, s.rows, s.cols);
  Eigen::Map<nn::matrix<scalar>> mine(s.shard.data(), s.row_count, s.cols);
  if constexpr (std::is_same_v<Param, scalar>) {
    if (sharded && s.placed) return s.placed->gather_over_replicas(mine, out);
    if constexpr (sharded) return detail::all_gather_start_on(dp_.comm(0), mine, out, 0);
    out = mine;
    return {};
  } else {
    if constexpr (!sharded) {
      out = mine.template cast<Param>().template cast<scalar>();
      return {};
    }
    struct in_flight {  // one allocation: MPI reads `rounded` and writes `all` until the gather is done
      nn::matrix<Param> rounded, all;
      pending_collective gather;
    };
    auto staged = std::make_shared<in_flight>();
    staged->rounded = mine.template cast<Param>();
    staged->gather = detail::all_gather_start_on(dp_.comm(0), staged->rounded, staged->all, 0);
    return pending_collective([staged, out]() mutable {
      staged->gather.wait();
      out = staged->all.template cast<scalar>();
    });
  }
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::release(detail::fsdp_unit& u) {
  if constexpr (keeps_master && sharded)  // no_shard in mixed precision keeps the memory, rounded again at a gather
    for (auto i : u.slots) slots_[i].resize_value(false);
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::finish_gradients(detail::fsdp_unit& u) {
  for (auto i : u.slots)
    if (!slots_[i].frozen) slots_[i].finish();
  for (auto i : u.slots)
    if (!slots_[i].frozen) slots_[i].mark_finished();
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::reduce_finished_gradients(detail::fsdp_unit& u) {
  for (auto i : u.slots) {
    auto& s = slots_[i];
    if (s.frozen) continue;
    Eigen::Map<nn::matrix<scalar>> whole(s.finished_grad(), s.rows, s.cols);
    Eigen::Map<nn::matrix<scalar>> into(s.shard_grad.data(), s.row_count, s.cols);
    if (s.placed) {  // summed over its ep group's tokens already: summed over its replicas, over every dp rank
      nn::matrix<scalar> part;
      s.placed->sum_scatter_over_replicas(nn::matrix<scalar>(whole), part);
      into += part / static_cast<scalar>(dp_.size(0));
    } else if constexpr (std::is_same_v<reduce_type, scalar>) {
      average_into(whole, into);
    } else {
      nn::matrix<reduce_type> rounded = whole.template cast<reduce_type>();
      average_into(rounded, into);
    }
    s.clear_grad(sharded);
  }
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
template <class Whole>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::average_into(Whole& whole,
                                                                          Eigen::Map<nn::matrix<scalar>>& into) {
  using E = typename Whole::Scalar;
  if constexpr (sharded) {
    nn::matrix<E> part;
    detail::reduce_scatter_on(dp_.comm(0), whole, part, 0, detail::op_kind::avg);
    if constexpr (!std::is_same_v<ReplicateMesh, no_replication>)
      detail::all_reduce_on(replicate_->comm(0), part, detail::op_kind::avg);
    into += part.template cast<scalar>();
  } else {
    detail::all_reduce_on(dp_.comm(0), whole, detail::op_kind::avg);
    into += whole.template cast<scalar>();
  }
}

template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh>
template <class Fn>
void fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>::shardwise_for_each_parameter_shard(Fn&& fn) {
  reshard();
  std::size_t i = 0;
  for_each_parameter(model_, [&](std::string const& name, auto const& p) {
    auto& s = slots_[i++];
    scalar* master = keeps_master ? s.shard.data() : s.resize_value(true);
    nn::matrix<scalar> shard = Eigen::Map<nn::matrix<scalar> const>(master, s.row_count, s.cols);
    fn(name, p, s.rows, s.cols, s.first_row, shard);
    std::copy(shard.data(), shard.data() + shard.size(), master);
  });
}

/// Sets the sharded model's gradient shards to zero (after an optimizer step).
template <module Model, class Policy, class ShardMesh, class ReplicateMesh>
void zero_grad(fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>& model) {
  model.zero_grad();
}

}  // namespace shardwise

#pragma once
// Fully sharded data parallelism: sw::fully_shard<Policy>(model, dp) cuts every parameter (this rank's tensor-
// parallel shard of it, when the model is parallelized) by rows over the data-parallel axis, as FSDP2 cuts dim 0
// (torch.chunk sizes, so uneven counts work). The model keeps its own code: a unit's module, called through
// sw::forward / sw::backward, finds its parameters gathered before it runs; after its backward its gradients are
// finished over tp, reduce-scattered (averaged) over dp into this rank's gradient shard and freed. The optimizer
// steps the shards the sharded model hands it (AdamW::step(sharded)), so there is nothing to remap.
#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardwise/core/error.hpp"
#include "shardwise/core/module_hooks.hpp"
#include "shardwise/fsdp/policy.hpp"
#include "shardwise/fsdp/schedule.hpp"
#include "shardwise/fsdp/units.hpp"
#include "shardwise/mesh/collectives.hpp"
#include "shardwise/mesh/mesh.hpp"
#include "shardwise/nn/experts/expert_parallel.hpp"
#include "shardwise/nn/kernels/functional_types.hpp"
#include "shardwise/nn/lazy.hpp"
#include "shardwise/nn/walk.hpp"
#include "shardwise/placement/chunk.hpp"

namespace shardwise {

/// Hybrid sharding's absence: the parameters are sharded over the whole data-parallel axis.
struct no_replication {};

/// A model under FSDP (made by sw::fully_shard). Call its forward and backward instead of the model's; hand it
/// to the optimizer (AdamW::step(sharded)); sw::zero_grad(sharded) after the step. The model must outlive it and
/// stay where it is.
template <module Model, class Policy, device_mesh ShardMesh, class ReplicateMesh = no_replication>
class fully_sharded final : detail::fsdp_unit_actions {
  using strategy = typename Policy::strategy;
  static constexpr bool sharded = !std::is_same_v<strategy, no_shard>;
  using param_type =
      typename detail::precision_types<typename Policy::precision, detail::model_element_t<Model>>::param;
  using reduce_type =
      typename detail::precision_types<typename Policy::precision, detail::model_element_t<Model>>::reduce;
  /// Whether the shard is a copy of its own (the master): sharded, or gathered in another type.
  static constexpr bool keeps_master = sharded || !std::is_same_v<param_type, detail::model_element_t<Model>>;
  static_assert(detail::is_fsdp_strategy<strategy>,
                "shardwise::fsdp_policy: the strategy must be full_shard, shard_grad_op or no_shard");
  static_assert(ShardMesh::ndim == 1,
                "shardwise::fully_shard: pass the 1-D data-parallel mesh (sw::submesh<\"dp\">(mesh))");
  static_assert(detail::wrap_check<Model, typename Policy::wrap>::ok,
                "shardwise::fully_shard: the wrap policy does not fit the model (the error above says where)");

 public:
  using scalar = detail::model_element_t<Model>;  ///< The parameters' element type.

  /// Shards `model` (parallelized over tp already, or not at all) over `dp`; hybrid: over `dp` within each group
  /// of `replicate`, whose groups hold equal shards. Every dp rank must hold the same values (the same seed, or a
  /// load); its copy beyond its shard is freed here.
  fully_sharded(Model& model, ShardMesh dp, std::optional<ReplicateMesh> replicate, fsdp_options options)
      : model_(model),
        dp_(std::move(dp)),
        replicate_(std::move(replicate)),
        options_(options),
        schedule_(*this, {std::is_same_v<strategy, full_shard>, keeps_master, options.forward_prefetch,
                          options.backward_prefetch}) {
    check_placed_experts();
    detail::find_fsdp_units<typename Policy::wrap>(model_, units(), candidates_);
    make_slots();
    detail::agree_on_fsdp_structure(dp_.comm(0), slots_, units(), detail::fsdp_strategy_name<strategy>);
    if constexpr (!std::is_same_v<ReplicateMesh, no_replication>)
      detail::agree_on_fsdp_structure(replicate_->comm(0), slots_, units(), detail::fsdp_strategy_name<strategy>);
    for (auto& s : slots_) s.clear_grad(sharded);
    in_flight_.resize(units().size());
    for (auto& u : units()) schedule_.release(u);  // nothing kept: spare_ is not active outside a step
    attach(&schedule_);
  }
  /// The model's layers no longer call this object's hooks.
  ~fully_sharded() { attach(nullptr); }

  /// The model's forward (its root unit gathered for the step; each unit's module gathers in sw::forward).
  template <class... Args>
  auto forward(Args&&... args) {
    refuse_unfilled();
    detail::fsdp_schedule::pass const pass(schedule_);
    schedule_.begin_forward();
    auto y = model_.forward(std::forward<Args>(args)...);
    schedule_.end_forward();
    return y;
  }

  /// The model's backward: each unit's gradients are reduce-scattered after its sw::backward, the root's last.
  template <class... Args>
  decltype(auto) backward(Args&&... args) {
    detail::fsdp_schedule::pass const pass(schedule_);
    schedule_.begin_backward();
    if constexpr (std::is_void_v<decltype(model_.backward(std::forward<Args>(args)...))>) {
      model_.backward(std::forward<Args>(args)...);
      schedule_.end_backward();
    } else {
      auto dx = model_.backward(std::forward<Args>(args)...);
      schedule_.end_backward();
      return dx;
    }
  }

  /// FSDP2's set_requires_gradient_sync: whether a backward reduce-scatters the gradients (the default). Off, the
  /// layers keep accumulating whole gradients over backwards (gradient accumulation, or a pipeline step's
  /// microbatches, or pipeline steps) and nothing moves over dp; the next backward (or pipeline step) with it on
  /// reduces the sum. The optimizer refuses shards whose gradients are still unreduced.
  void set_requires_gradient_sync(bool on) { schedule_.sync = on; }
  /// Whether a backward reduce-scatters the gradients (set_requires_gradient_sync).
  [[nodiscard]] bool requires_gradient_sync() const { return schedule_.sync; }

  /// For sw::run_pipeline_step: this rank's pipeline chunks (the model's stage_chunks, or the model as one).
  auto shardwise_pipeline_chunks() {
    if constexpr (requires { std::span(model_); })
      return std::span(model_);
    else
      return std::span(&model_, 1);
  }
  /// For sw::run_pipeline_step, before a step's first action: the root unit gathered for the whole step (the
  /// last stage's head runs outside any chunk's forward), every other unit released and its counts reset;
  /// `every_microbatch`: a unit's gradients are reduce-scattered after each of its backwards, else at the end.
  void shardwise_pipeline_begin(bool every_microbatch) {
    refuse_unfilled();
    schedule_.begin_pipeline_step(every_microbatch);
  }
  /// For sw::run_pipeline_step, before a forward action: the units' hooks act as in a forward.
  void shardwise_pipeline_forward() { schedule_.pipeline_forward(); }
  /// For sw::run_pipeline_step, before a backward action: the units' hooks act as in a backward (a recomputed
  /// forward gathers without releasing).
  void shardwise_pipeline_backward() { schedule_.pipeline_backward(); }
  /// For sw::run_pipeline_step, after a step's last action: the gradients left unreduced (no gradient sync) and
  /// the root's reduced, the root released; throws, naming the unit, if a unit's forwards and backwards differ.
  void shardwise_pipeline_end() { schedule_.end_pipeline_step(); }
  /// For sw::run_pipeline_step, when a step throws: the hooks stop acting.
  void shardwise_pipeline_abandon() { schedule_.abandon(); }

  /// Gathers every unit's masters in full precision (collective): the model then holds its whole parameters,
  /// to read or save them. The next forward gathers again (in the policy's precision).
  void unshard() {
    schedule_.finish_prefetches();
    for (auto& u : units()) {
      for (auto i : u.slots) gather_slot<detail::model_element_t<Model>>(slots_[i]).wait();
      u.gathered = !keeps_master;
    }
  }
  /// Frees the gathered parameters again, and the storage kept for the next pass (collective-free).
  void reshard() {
    spare_->stop();
    for (auto& u : units()) schedule_.release(u);
  }
  /// Sets the gradient shards to zero (after an optimizer step).
  void zero_grad() {
    for (auto& s : slots_) std::fill(s.shard_grad.begin(), s.shard_grad.end(), scalar(0));
  }

  /// Bytes of whole matrices (gathered parameters, full gradients) the last forward and backward took from
  /// storage a unit released instead of fresh memory. Under full_shard, units of the same shapes (the blocks)
  /// reuse each other's within a pass, the backward's first block takes the parameters the forward's last left,
  /// and a forward's root takes the root's from the backward before; a forward's first block, the backward's first
  /// block's gradients and the root's gradients are allocated. 0 for the other strategies.
  [[nodiscard]] std::size_t reused_bytes() const { return spare_->reused_bytes; }
  /// Bytes of released gathered parameters kept for the next pass under full_shard: after a forward, its last
  /// unit's; after a backward (between steps), the root unit's, which every step holds whole anyway (under
  /// wrap_none the root is the whole model). reshard() frees them.
  [[nodiscard]] std::size_t kept_bytes() const { return spare_->bytes(); }

  /// The units' paths ("" is the root unit), in order.
  [[nodiscard]] std::vector<std::string> unit_paths() const {
    std::vector<std::string> paths;
    for (auto const& u : schedule_.units) paths.push_back(u.path);
    return paths;
  }
  /// The names of the parameters of unit `i` (of unit_paths()).
  [[nodiscard]] std::vector<std::string> unit_parameters(std::size_t i) const {
    std::vector<std::string> names;
    for (auto s : schedule_.units.at(i).slots) names.push_back(slots_[s].name);
    return names;
  }
  /// Elements this rank keeps between steps: parameter and gradient shards (no_shard: whole tensors); a frozen
  /// parameter (sw::freeze) has no gradient shard.
  [[nodiscard]] std::size_t held_elements() const {
    std::size_t n = 0;
    for (auto const& s : slots_) n += (s.frozen ? 1 : 2) * static_cast<std::size_t>(s.row_count * s.cols);
    return n;
  }
  [[nodiscard]] Model& model() { return model_; }  ///< The model (its parameters freed between units' calls).
  /// How many units' all-gathers started ahead of their use (fsdp_options::forward_prefetch, backward_prefetch).
  [[nodiscard]] std::size_t prefetched_gathers() const { return schedule_.prefetched(); }

  /// For optimizers: fn(name, value, grad, norm_weight) per trained parameter shard (frozen ones, sw::freeze, are
  /// left out), in a fixed order; norm_weight is what its squares count in the global norm on this rank (0 where
  /// another rank counts them).
  template <class Fn>
  void shardwise_for_each_shard(Fn&& fn) {
    refuse_unreduced_gradients();
    for (auto& s : slots_) {
      if (s.frozen) continue;
      auto const n = static_cast<std::size_t>(s.row_count * s.cols);
      scalar* value = keeps_master ? s.shard.data() : s.resize_value(true);
      fn(std::string_view(s.name), std::span<scalar>(value, n), std::span<scalar const>(s.shard_grad.data(), n),
         s.norm_weight);
    }
  }
  /// For checkpoints: fn(name, parameter, rows, cols, first_row, shard) per parameter, in the model's order:
  /// `shard` is a matrix of this rank's rows [first_row, + its rows) of the parameter's rows x cols tensor on
  /// this tp rank (parameter.value is freed between units' calls); what fn leaves in it becomes the shard. The
  /// units are released first, so a forward after a load gathers the new values.
  template <class Fn>
  void shardwise_for_each_parameter_shard(Fn&& fn);
  /// For loaders, once a load has succeeded: the shards hold a checkpoint's values, so a model declared with
  /// sw::Lazy may run.
  void shardwise_mark_loaded() { unfilled_ = false; }
  /// Whether the model was declared with sw::Lazy and no load has filled its shards yet.
  [[nodiscard]] bool shardwise_unfilled() const { return unfilled_; }
  /// The model's configuration, for checkpoints, when the model states one.
  [[nodiscard]] auto shardwise_config() const
    requires requires(Model const& m) { m.shardwise_config(); }
  {
    return model_.shardwise_config();
  }
  /// Whether each data-parallel rank holds only its rows (full shard, shard-grad-op), not whole tensors.
  static constexpr bool shards_parameters = sharded;
  [[nodiscard]] ShardMesh const& data_mesh() const { return dp_; }  ///< The mesh the parameters are sharded over.
  /// The mesh the shards are replicated over (hybrid sharding).
  [[nodiscard]] ReplicateMesh const& replicate_mesh() const
    requires(!std::is_same_v<ReplicateMesh, no_replication>)
  {
    return *replicate_;
  }
  /// This rank's replica under hybrid sharding (its coordinate on the replicate mesh); 0 otherwise.
  [[nodiscard]] int replica() const {
    if constexpr (std::is_same_v<ReplicateMesh, no_replication>)
      return 0;
    else
      return replicate_->rank();
  }
  /// The size of the tensor-parallel group the parameters are cut over (1 without tensor parallelism).
  [[nodiscard]] int tensor_parallel_size() const { return tp_group_ ? tp_group_->size() : 1; }

  /// For optimizers: a sum of squares of this rank's shards summed over every rank that holds other shards
  /// (tp, and dp unless no_shard), so every rank has the global one.
  scalar shardwise_sum_over_shards(scalar squares) const {
    nn::vector<scalar> total = nn::vector<scalar>::Constant(1, squares);
    if (tp_group_) tp_group_->all_reduce(total);
    if (sharded) detail::all_reduce_on(dp_.comm(0), total, detail::op_kind::sum);
    return total(0);
  }

 private:
  std::vector<detail::fsdp_unit>& units() { return schedule_.units; }
  std::vector<detail::fsdp_unit> const& units() const { return schedule_.units; }

  /// Every layer of the model carries these hooks (or none): sw::forward(module) finds them on its layers.
  void attach(detail::module_hooks* hooks) {
    detail::for_each_layer(model_, [&](auto& l) {
      if constexpr (requires { l.shardwise_attach_hooks(hooks); }) l.shardwise_attach_hooks(hooks);
    });
  }

  // What the schedule's decisions do (detail::fsdp_unit_actions), in fsdp/fully_shard_hooks.hpp.
  void gather(detail::fsdp_unit& u) override;
  void start_gather(detail::fsdp_unit& u) override;
  void finish_gather(detail::fsdp_unit& u) override;
  void release(detail::fsdp_unit& u) override;
  void finish_gradients(detail::fsdp_unit& u) override;
  void reduce_finished_gradients(detail::fsdp_unit& u) override;
  void reuse_gradients(detail::fsdp_unit& u) override;
  void at(detail::fsdp_moment moment) override;

  /// A model declared with sw::Lazy and not loaded yet cannot run.
  void refuse_unfilled() const;
  /// Experts placed over ep (sw::expert_parallelize) are cut over their replicas: the ep ranks times the replicas
  /// must be the dp ranks, in full precision and without hybrid sharding or no_shard (refused by name otherwise).
  void check_placed_experts() const;
  /// The optimizer (or a checkpoint) would read gradient shards that miss the whole gradients still held.
  void refuse_unreduced_gradients() const;

  /// Starts the parameter's whole (this tp rank's) tensor from the dp ranks' shards, rounded to Param on the
  /// way; the returned collective finishes it (at once where there is nothing to wait for).
  template <class Param>
  pending_collective gather_slot(detail::fsdp_slot<scalar>& s);

  /// into += this rank's rows of the average of `whole` over dp (hybrid: and over the replicas), reduced in
  /// whole's element type.
  template <class Whole>
  void average_into(Whole& whole, Eigen::Map<nn::matrix<scalar>>& into);

  /// The slots of every parameter, in for_each_parameter's order. A layer declared with sw::Lazy is allocated
  /// (zeros) and freed again at once, so that a lazy model is never whole: one layer at most.
  void make_slots();

  template <class P>
  void make_slot_of(std::string const& name, P const& p, std::vector<std::size_t>& sizes);

  /// The tensor as data-parallel rank 0 holds it (hybrid: replica 0's rank 0).
  template <class Tensor>
  void broadcast_from_first(Tensor& value);

  template <class P>
  /// The slot of one parameter: this rank's shard of it and of its gradient, and how to resize, finish and clear
  /// the layer's tensors.
  detail::fsdp_slot<scalar> make_slot(std::string const& name, P const& p);

  Model& model_;
  ShardMesh dp_;
  std::optional<ReplicateMesh> replicate_;
  fsdp_options options_;
  std::vector<detail::fsdp_unit> candidates_;  // wrap_min_params: every module, to pick units from by size
  // Shared with the slots' closures, which outlive no fully_sharded but may be moved with it.
  std::shared_ptr<detail::fsdp_spare_matrices<scalar>> spare_ = std::make_shared<detail::fsdp_spare_matrices<scalar>>();
  std::vector<detail::fsdp_slot<scalar>> slots_;
  nn::group<scalar> const* tp_group_ = nullptr;
  std::vector<std::vector<pending_collective>> in_flight_;  // per unit: the gathers started and not yet finished
  detail::fsdp_schedule schedule_;                          // when each unit gathers, releases and reduces
  bool unfilled_ = false;  // declared with sw::Lazy: the shards are zeros until a load fills them
};

}  // namespace shardwise

// The members on units and slots, defined apart.
#include "shardwise/fsdp/fully_shard_slots.hpp"
// The hooks around the model's modules, and pipeline steps over it (sw::run_pipeline_step), defined apart.
#include "shardwise/fsdp/fully_shard_hooks.hpp"

namespace shardwise {

namespace detail {
/// Whether the policy shards over an axis of `names` that its tensor parallelism uses: the data axis is the
/// tensor axis, or a 1-D mesh given as the data-parallel one is named as the tensor axis.
template <class Policy, std::size_t N>
constexpr bool fsdp_on_tensor_axis(std::array<std::string_view, N> const& names) {
  return Policy::data_axis.view() == Policy::tensor_axis.view() || (N == 1 && names[0] == Policy::tensor_axis.view());
}

template <class Policy, class Mesh>
constexpr bool fsdp_axes_apart() {
  constexpr bool apart = !fsdp_on_tensor_axis<Policy>(Mesh::names);
  if constexpr (!apart) {
    using shown [[maybe_unused]] =
        decltype(show_incomplete<fsdp_and_tensor_parallelism_on_one_axis<Policy::tensor_axis>>());
  }
  return apart;
}
}  // namespace detail

/// Shards the model by the policy (sw::fsdp_policy<Strategy, Wrap>: FULL_SHARD, SHARD_GRAD_OP or NO_SHARD).
/// `mesh` is the 1-D data-parallel mesh (call sw::parallelize(model, tp) first for FSDP x TP), or a mesh of
/// the policy's data axis ("dp") and tensor axis ("tp"): then the model is parallelized over the tensor axis
/// and sharded over the data axis, as torchtitan's parallelize_llama does with its world mesh.
template <class Policy, module Model, device_mesh Mesh>
[[nodiscard]] auto fully_shard(Model& model, Mesh const& mesh, fsdp_options options = {}) {
  static_assert(detail::fsdp_axes_apart<Policy, Mesh>(),
                "shardwise::fully_shard: the policy shards parameters over the axis its tensor parallelism uses; "
                "pass the data-parallel mesh, and give fsdp_policy a data axis the plan does not cut (\"dp\") and a "
                "tensor axis (\"tp\")");
  if constexpr (Mesh::ndim == 1) {
    return fully_sharded<Model, Policy, Mesh>(model, mesh, std::nullopt, options);
  } else {
    static_assert(std::ranges::all_of(Mesh::names,
                                      [](std::string_view name) {
                                        return name == Policy::data_axis.view() || name == Policy::tensor_axis.view();
                                      }),
                  "shardwise::fully_shard: the mesh has an axis that is neither the policy's data axis nor its "
                  "tensor axis, which FSDP would leave out; for hybrid sharding pass the shard and the replicate "
                  "1-D meshes");
    if constexpr (std::ranges::find(Mesh::names, Policy::tensor_axis.view()) != Mesh::names.end())
      parallelize(model, submesh<Policy::tensor_axis>(mesh));
    auto dp = submesh<Policy::data_axis>(mesh);
    return fully_sharded<Model, Policy, decltype(dp)>(model, dp, std::nullopt, options);
  }
}

/// Hybrid sharding (HYBRID_SHARD): sharded over `shard` (within a node, say), replicated over `replicate`
/// (across nodes); gradients reduce-scattered over `shard`, then averaged over `replicate`.
template <class Policy, module Model, device_mesh ShardMesh, device_mesh ReplicateMesh>
[[nodiscard]] auto fully_shard(Model& model, ShardMesh const& shard, ReplicateMesh const& replicate,
                               fsdp_options options = {}) {
  static_assert(!std::is_same_v<typename Policy::strategy, no_shard>,
                "shardwise::fully_shard: hybrid sharding needs full_shard or shard_grad_op; no_shard replicates "
                "over one data-parallel mesh");
  static_assert(ReplicateMesh::ndim == 1, "shardwise::fully_shard: pass the 1-D replicate mesh");
  return fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>(model, shard, replicate, options);
}

/// fully_shard of a model declared with sw::Lazy (Accelerate's cpu_ram_efficient_loading, FSDP2's meta-device
/// init): each layer is allocated in turn, its shards kept and the rest freed at once, so no rank ever holds
/// more than its shards and one layer. The shards are zeros: fill them with sw::load_sharded or
/// sw::load_consolidated (only_rank0_reads: rank 0 alone reads) before the first forward, which refuses before.
template <class Policy, module Model, device_mesh Mesh>
[[nodiscard]] auto fully_shard(Lazy<Model>& lazy, Mesh const& mesh, fsdp_options options = {}) {
  return fully_shard<Policy>(lazy.unmaterialized(), mesh, options);
}

/// Hybrid sharding of a model declared with sw::Lazy, as above.
template <class Policy, module Model, device_mesh ShardMesh, device_mesh ReplicateMesh>
[[nodiscard]] auto fully_shard(Lazy<Model>& lazy, ShardMesh const& shard, ReplicateMesh const& replicate,
                               fsdp_options options = {}) {
  return fully_shard<Policy>(lazy.unmaterialized(), shard, replicate, options);
}

}  // namespace shardwise

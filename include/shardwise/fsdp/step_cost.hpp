#pragma once
// FSDP's cost from the code that runs: the model, built on shapes (element type sw::meta<T>), runs its own forward
// and backward, and the schedule sw::fully_shard's hooks use (fsdp/schedule.hpp) gathers, releases and reduces its
// units around the same module calls, recording each all-gather and reduction where the real step makes it. What a
// unit holds comes from the same wrap policy and the same walk of the model's parameters as fully_shard's.
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardwise/core/error.hpp"
#include "shardwise/cost/cost.hpp"
#include "shardwise/cost/meta_trace.hpp"
#include "shardwise/fsdp/policy.hpp"
#include "shardwise/fsdp/schedule.hpp"
#include "shardwise/nn/derived_cost.hpp"
#include "shardwise/nn/meta.hpp"
#include "shardwise/pipeline/cost.hpp"
#include "shardwise/placement/chunk.hpp"

namespace shardwise {

/// Where one FSDP training step runs, for sw::fsdp_step_cost.
struct fsdp_step_inputs {
  cost_inputs tp;                                 ///< One microbatch's tokens, and the tensor-parallel axis.
  std::size_t microbatches = 1;                   ///< Forward and backward passes per step.
  std::size_t dp = 1;                             ///< Ranks the parameters are sharded over.
  std::size_t dp_rank = 0;                        ///< This rank's coordinate among them.
  std::string_view dp_axis = "dp";                ///< Their axis' name.
  std::size_t replicate = 1;                      ///< Hybrid sharding: the replicate mesh's size (1: none).
  std::string_view replicate_axis = "replicate";  ///< Its axis' name.
  /// The model was given to sw::parallelize (even over one rank): the norm's squares are summed over tp.
  bool parallelized = true;
  fsdp_options options{};  ///< fully_shard's options (min_num_params, forward_prefetch, backward_prefetch).
};

namespace detail {

/// A model on shapes under FSDP: the units fully_shard<Policy> would make of it, and what its schedule's
/// decisions record — a gather's all-gathers of this rank's rows of each parameter, a reduction's tp finish
/// (sw::finish_gradients' step) and its reduce-scatters (all-reduces for no_shard; averaged over the replicas under
/// hybrid sharding). Within module calls into the run's trace, where the model's own transfers go; between them
/// (a pass's start and end: the root unit's gathers and reductions) into `outside`, which the driver keeps in
/// order with the trace's record. T: the model's real element type; N: `outside`'s capacity.
template <class Policy, class T, std::size_t N>
class fsdp_on_shapes final : fsdp_unit_actions {
  using strategy = typename Policy::strategy;
  using precision = precision_types<typename Policy::precision, T>;
  static constexpr bool sharded = !std::is_same_v<strategy, no_shard>;
  static_assert(is_fsdp_strategy<strategy>,
                "shardwise::fsdp_step_cost: the policy's strategy must be full_shard, shard_grad_op or no_shard");

 public:
  /// Finds the units of `model` (set up for its tp size) and hooks the schedule into `trace`.
  template <class Model>
  fsdp_on_shapes(Model& model, meta_trace& trace, fsdp_step_inputs const& t, transfer_list<N>& outside)
      : trace_(trace),
        outside_(outside),
        t_(t),
        schedule_(*this,
                  {std::is_same_v<strategy, full_shard>, sharded || !std::is_same_v<typename precision::param, T>,
                   t.options.forward_prefetch, t.options.backward_prefetch}),
        previous_hooks_(trace.hooks) {
    // The wrap policy checked against the model on shapes as fully_shard checks it (its own messages): a
    // wrap_type names the shape-only modules' types (element type sw::meta<T>).
    [[maybe_unused]] constexpr bool wrap_fits = wrap_check<Model, typename Policy::wrap>::ok;
    if (!sharded && t.replicate > 1)
      fail("shardwise::fsdp_step_cost: hybrid sharding (replicate ", t.replicate,
           ") needs full_shard or shard_grad_op; no_shard replicates over one data-parallel mesh");
    std::vector<fsdp_unit> candidates;
    find_fsdp_units<typename Policy::wrap>(model, schedule_.units, candidates);
    std::vector<std::string> names;
    std::vector<std::size_t> sizes;
    for_each_named_layer(model, [&](auto& layer, std::string const& path) {
      layer.shardwise_parameter_costs(trace.inputs, [&](parameter_cost const& p) {
        names.push_back(path + ".parameter");  // what matters is the layer's path: the units hold whole layers
        sizes.push_back(p.elements * (p.cut_over_tp ? t.tp.tp : 1));  // as fully_shard counts (min_num_params)
        slots_.push_back(p);
      });
    });
    assign_fsdp_units(schedule_.units, candidates, names, sizes, t.options.min_num_params);
    trace.hooks = &schedule_;
  }
  ~fsdp_on_shapes() { trace_.hooks = previous_hooks_; }
  fsdp_on_shapes(fsdp_on_shapes const&) = delete;
  fsdp_on_shapes& operator=(fsdp_on_shapes const&) = delete;

  /// The schedule, which the step's driver tells where its passes begin and end.
  fsdp_schedule& schedule() { return schedule_; }

 private:
  static std::size_t columns(parameter_cost const& p) {
    if (p.rows == 0)
      fail(
          "shardwise::fsdp_step_cost: a layer's shardwise_parameter_costs gives a parameter without rows; give "
          "each parameter its rows (FSDP cuts them over dp)");
    return p.elements / p.rows;
  }
  /// Where a transfer the schedule makes now goes: the trace's record within a module call, else `outside`.
  void add(transfer_kind kind, std::string_view axis, std::size_t bytes) {
    if (trace_.calls_open() > 0)
      trace_.recorded().add(kind, axis, bytes);
    else
      outside_.add(kind, axis, bytes);
  }
  void gather(fsdp_unit& u) override { start_gather(u); }
  void start_gather(fsdp_unit& u) override {
    if (!sharded) return;  // no_shard: the layers hold whole tensors (in mixed precision, rounded in place)
    for (auto i : u.slots) {
      parameter_cost const& p = slots_[i];
      std::size_t const mine = chunk_size(p.rows, t_.dp, t_.dp_rank) * columns(p);
      add(transfer_kind::all_gather, t_.dp_axis, mine * sizeof(typename precision::param));
    }
  }
  void finish_gather(fsdp_unit&) override {}
  void release(fsdp_unit&) override {}
  void finish_gradients(fsdp_unit& u) override {
    auto const walk = [&](auto&& fn) {
      for (auto i : u.slots) fn(slots_[i]);
    };
    auto const finished = finish_gradients_cost<meta_trace::recorded_capacity>(walk, t_.tp);
    if (trace_.calls_open() > 0)
      trace_.recorded().append(finished);
    else
      outside_.append(finished);
  }
  void reduce_finished_gradients(fsdp_unit& u) override {
    constexpr std::size_t e = sizeof(typename precision::reduce);
    for (auto i : u.slots) {
      parameter_cost const& p = slots_[i];
      std::size_t const row = columns(p) * e;
      add(sharded ? transfer_kind::reduce_scatter : transfer_kind::all_reduce, t_.dp_axis, p.rows * row);
      if (sharded && t_.replicate > 1)
        add(transfer_kind::all_reduce, t_.replicate_axis, chunk_size(p.rows, t_.dp, t_.dp_rank) * row);
    }
  }

  meta_trace& trace_;
  transfer_list<N>& outside_;
  fsdp_step_inputs t_;
  std::vector<parameter_cost> slots_;
  fsdp_schedule schedule_;
  module_hooks* previous_hooks_;
};

/// A step's passes under FSDP: the schedule told where each begins and ends, as fully_sharded's forward and
/// backward tell it.
struct fsdp_passes {
  fsdp_schedule& schedule;
  void begin_forward() { schedule.begin_forward(); }
  void end_forward() { schedule.end_forward(); }
  void begin_backward() { schedule.begin_backward(); }
  void end_backward() { schedule.end_backward(); }
};

}  // namespace detail

/// The transfers of one training step of a model under sw::fully_shard<Policy>, on one rank, in the order they
/// run: `t.microbatches` times the sharded model's forward on t.tp.tokens ids, `loss(logits, ids)` (which returns
/// the logits' gradient) and its backward; then the optimizer's global norm (AdamW::step(sharded)): its squares
/// summed over tp (a parallelized model) and over dp (sharded strategies). Model is the model on shapes (element
/// type sw::meta<T>), built from `args`, set up for t.tp.tp ranks as sw::parallelize sets up the real one, then
/// handed to `prepare` (`model.checkpoint_blocks(true)`, say). Policy is the real step's fsdp_policy (a wrap_type
/// names the shape-only modules' types). Derived by running the model's own code with fully_shard's schedule:
/// in microseconds per module call, whatever the sizes, at run time (the units are found by a walk that names
/// them). The step is the first one: with forward_prefetch, later steps prefetch in the order the last forward ran
/// its units, which under wrap_min_params (units made children first) differs. Capacity: the entries the result
/// holds (a repeated block's stored once; the root unit's gathers and reductions, between the passes, in full).
template <class Policy, class Model, std::size_t Capacity = 1024, class Prepare, class Loss, class... Args>
transfer_list<Capacity> fsdp_step_cost(fsdp_step_inputs const& t, Prepare&& prepare, Loss&& loss, Args&&... args) {
  using Logits = decltype(std::declval<Model&>().forward(std::declval<meta_ids const&>()));
  using T = typename Logits::element_type::element;  // the real element type the shapes stand for
  meta_trace trace{t.tp};
  transfer_list<Capacity> list;
  {
    Model model(std::forward<Args>(args)...);
    detail::set_up_shapes_for(model, static_cast<int>(t.tp.tp));
    prepare(model);
    detail::fsdp_on_shapes<Policy, T, Capacity> fsdp(model, trace, t, list);
    detail::fsdp_passes around{fsdp.schedule()};  // the root gathered at each forward's start, reduced last
    detail::run_passes_on_shapes(model, trace, t.microbatches, loss, around, list);
  }
  // AdamW::step(sharded)'s norm: fully_sharded::shardwise_sum_over_shards.
  if (t.parallelized) list.add(transfer_kind::all_reduce, t.tp.tp_axis, sizeof(T));
  if (!std::is_same_v<typename Policy::strategy, no_shard>) list.add(transfer_kind::all_reduce, t.dp_axis, sizeof(T));
  return list;
}

/// What one pipeline stage under sw::fully_shard<Policy> does per microbatch and per step (sw::stage_transfers, for
/// sw::pipeline_step_cost), as sw::run_pipeline_step drives the sharded stage: before the step the root unit
/// gathered for the whole step; each forward the stage's own (on token ids on the first stage, else on the stream
/// of [tokens, features] the stage before sends; on the last, head_loss right after) with each unit gathered
/// before its module; each backward the stage's, each unit gathered again, its gradients finished over tp and,
/// with `every_microbatch`, reduced; after the step `exchange` (what the stage's shardwise_after_pipeline_step
/// sends: tied weights' gradients), then what was left unreduced and the root's reductions. Stage is the stage on
/// shapes, built from `args`, set up for t.tp.tp ranks, handed to `prepare`; Stream its sw::Activation of
/// sw::meta<T>. Derived from the stage's own code and fully_shard's schedule, at run time. A pipeline step
/// prefetches nothing and one action is one microbatch: t.options' prefetch and t.microbatches are not read.
template <class Policy, class Stage, class Stream, std::size_t N = 64, class Prepare, class... Args>
stage_transfers<N> fsdp_stage_transfers(fsdp_step_inputs const& t, std::size_t features, bool every_microbatch,
                                        transfer_list<N> const& exchange, Prepare&& prepare, Args&&... args) {
  using T = typename Stream::element_type::element;
  cost_inputs const& s = t.tp;
  meta_trace trace{s};
  stage_transfers<N> out;
  {
    Stage stage(std::forward<Args>(args)...);
    detail::set_up_shapes_for(stage, static_cast<int>(s.tp));
    prepare(stage);
    transfer_list<N> outside;  // the root's gathers and the step's last reductions
    detail::fsdp_on_shapes<Policy, T, N> fsdp(stage, trace, t, outside);
    auto& schedule = fsdp.schedule();
    schedule.begin_pipeline_step(every_microbatch);
    out.before_step.append(outside);
    outside.clear();
    schedule.pipeline_forward();
    meta_ids const ids{s.tokens, &trace};
    Stream h = stage.is_first() ? stage.forward(ids) : stage.forward(detail::received_stream<Stream>(trace, features));
    Stream dh = stage.is_last() ? stage.head_loss(trace, h, ids).gradient : h;
    trace.take_record(out.forward);
    schedule.pipeline_backward();
    {
      Stream dx = stage.backward(std::move(dh));
    }
    trace.take_record(out.backward);
    out.after_step.append(exchange);
    schedule.end_pipeline_step();
    out.after_step.append(outside);
  }
  return out;
}

}  // namespace shardwise

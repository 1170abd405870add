#pragma once
// Runs one pipeline step on this rank: its action table (from a schedule, checked on every rank before any
// data moves) drives its model chunks, one microbatch at a time. Each forward's activations are moved out of
// the chunk into that microbatch's saved_activations, so the chunk can run the next microbatch's forward before
// this one's backward; activations and gradients cross to the neighbouring stages over the pipeline axis.
#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardwise/core/error.hpp"
#include "shardwise/core/show.hpp"
#include "shardwise/mesh/call.hpp"
#include "shardwise/mesh/collectives.hpp"
#include "shardwise/nn/activation.hpp"
#include "shardwise/nn/kernels/functional_types.hpp"
#include "shardwise/nn/module_call.hpp"
#include "shardwise/nn/training/deferred_weight_gradients.hpp"
#include "shardwise/pipeline/schedule.hpp"
#include "shardwise/pipeline/stages.hpp"
#include "shardwise/pipeline/step_terms.hpp"
#include "shardwise/plan/saved.hpp"

namespace shardwise {

/// How a pipeline step keeps what a chunk's forward made for its backward.
enum class stage_activations {
  keep,       ///< held per microbatch in flight until its backward (memory: the chunk's activations each)
  recompute,  ///< activation checkpointing per stage: only the chunk's input is held, the forward runs again
};

/// When the stages of a fully sharded model (run_pipeline_step over sw::fully_shard's model) reduce-scatter their
/// gradients over the data-parallel axis.
enum class sharded_gradient_reduction {
  every_microbatch,  ///< after each backward of a unit: its whole gradients are freed at once (least memory)
  end_of_step,       ///< once, when the step ends: whole gradients held all step, 1 / microbatches the traffic
};

/// Options of run_pipeline_step.
struct pipeline_options {
  stage_activations activations = stage_activations::keep;  ///< See stage_activations.
  /// For a fully sharded model only: see sharded_gradient_reduction (PyTorch's pipelining reduces at the end).
  sharded_gradient_reduction sharded_gradients = sharded_gradient_reduction::every_microbatch;
};

namespace detail {

/// What drives a rank's chunks through a pipeline step besides the schedule: a fully sharded model
/// (fsdp/fully_shard_pipeline.hpp) gathers and reduces its units around the actions.
template <class D>
concept pipeline_driver = requires(D& d) {
  d.shardwise_pipeline_chunks();
  d.shardwise_pipeline_begin(true);
  d.shardwise_pipeline_forward();
  d.shardwise_pipeline_backward();
  d.shardwise_pipeline_end();
  d.shardwise_pipeline_abandon();
};

/// The driver of plain chunks: nothing around the actions.
struct no_pipeline_driver {
  void shardwise_pipeline_forward() {}
  void shardwise_pipeline_backward() {}
};

/// What crosses a stage boundary: the activation (or its gradient) and what the chunks' hooks::pipeline_carry
/// passes beside it (nothing, for chunks without the hook).
template <class X>
struct stage_message {
  X stream{};
  nn::vector<double> carried{};
};

/// Whether a chunk passes sums beside its activations and gradients (hooks::pipeline_carry).
template <class Chunk>
constexpr bool carries = requires(Chunk& c, nn::vector<double> const& v) {
  { c.shardwise_pipeline_carry(v, pipeline_pass::forward, 0) } -> std::same_as<nn::vector<double>>;
};

/// What one rank holds for one (chunk, microbatch) between the steps of its table.
template <class Chunk, class In, class X>
struct microbatch_slot {
  stage_message<X> input{};                 ///< received activation
  stage_message<X> output{};                ///< forward output waiting to be sent
  stage_message<X> gradient{};              ///< received output gradient (or the loss's)
  stage_message<X> input_gradient{};        ///< backward's result waiting to be sent
  saved_activations<Chunk> kept{};          ///< the forward's activations, until the backward
  X recompute_from{};                       ///< stage_activations::recompute: the forward's input, kept instead
  In recompute_first{};                     ///< the same on the first stage: the model's input
  deferred_weight_gradients weight_work{};  ///< what B put off for W: each layer's input and output gradient
};

/// Tells a chunk which microbatch its next forward runs, when it asks (hooks::pipeline_microbatch).
template <class Chunk>
void announce_microbatch(Chunk& chunk, int microbatch) {
  if constexpr (requires { chunk.shardwise_pipeline_microbatch(microbatch); })
    chunk.shardwise_pipeline_microbatch(microbatch);
}

/// The activation type crossing the stage boundaries: what a chunk's forward makes of the model's input.
template <class Chunk, class In>
using stage_output_t = std::remove_cvref_t<decltype(forward(std::declval<Chunk&>(), std::declval<In const&>()))>;

/// Whether a chunk's forward and backward take and give the boundary activation X: each stage's output is the
/// next stage's input, in the same layout, and each backward hands back the gradient in it.
template <class Chunk, class X>
constexpr bool stages_chain() {
  if constexpr (requires(Chunk& c, X const& x) {
                  c.forward(x);
                  c.backward(x);
                })
    return std::is_same_v<std::remove_cvref_t<decltype(std::declval<Chunk&>().forward(std::declval<X const&>()))>, X> &&
           std::is_same_v<std::remove_cvref_t<decltype(std::declval<Chunk&>().backward(std::declval<X const&>()))>, X>;
  else
    return false;
}

template <class Output>
struct stage_output_is_not_the_next_stage_input;  // incomplete on purpose: the compile error spells the layout

/// One rank's pipeline step: the state of every (chunk, microbatch) between the actions of its table.
template <class Mesh, class Chunk, class In, class X, class Input, class LossGradient, class Driver>
class pipeline_step {
  using slot_type = microbatch_slot<Chunk, In, X>;

 public:
  pipeline_step(Mesh const& pp, pipeline_shape shape, std::span<Chunk> chunks, Input& input, LossGradient& loss,
                pipeline_options options, Driver& driver)
      : pp_(pp),
        shape_(shape),
        rank_(pp.rank()),
        chunks_(chunks),
        input_(input),
        loss_gradient_(loss),
        recompute_(options.activations == stage_activations::recompute),
        driver_(driver) {
    slots_.resize(chunks.size());
    for (auto& per_chunk : slots_) per_chunk.resize(static_cast<std::size_t>(shape.microbatches));
  }

  void run(pipeline_action const& action) {
    switch (action.kind) {
      case action_kind::forward:
        return forward_of(action);
      case action_kind::backward:
        return backward_of(action);
      case action_kind::backward_input:
        return backward_input_of(action);
      case action_kind::backward_weight:
        return slot(action).weight_work.run();
      case action_kind::send_activation:
        return send(action, slot(action).output, 1, &slot_type::input);
      case action_kind::send_gradient:
        return send(action, slot(action).input_gradient, -1, &slot_type::gradient);
      case action_kind::recv_activation:
        return receive(action, slot(action).input);
      case action_kind::recv_gradient:
        return receive(action, slot(action).gradient);
    }
  }

 private:
  slot_type& slot_at(int chunk, int microbatch) {
    return slots_[static_cast<std::size_t>(chunk)][static_cast<std::size_t>(microbatch)];
  }
  slot_type& slot(pipeline_action const& action) { return slot_at(action.chunk, action.microbatch); }
  Chunk& chunk_of(pipeline_action const& action) { return chunks_[static_cast<std::size_t>(action.chunk)]; }
  int stage_of(pipeline_action const& action) const { return shape_.stage_of(rank_, action.chunk); }

  void forward_of(pipeline_action const& action) {
    driver_.shardwise_pipeline_forward();
    auto& here = slot(action);
    int const stage = stage_of(action);
    announce_microbatch(chunk_of(action), action.microbatch);
    X y = shape_.is_first(stage) ? forward_first(action, here) : forward_rest(action, here);
    nn::vector<double> carried;
    if constexpr (carries<Chunk>)
      carried =
          chunk_of(action).shardwise_pipeline_carry(here.input.carried, pipeline_pass::forward, action.microbatch);
    here.input.carried = {};
    if (recompute_) {
      drop_saved_activations(chunk_of(action));
    } else {
      here.kept.take_from(chunk_of(action));  // the chunk is free for the next microbatch's forward
    }
    if (shape_.is_last(stage)) {
      here.gradient = {loss_gradient_(action.microbatch, y), std::move(carried)};  // the carry turns back here
      // The loss ran the head forward and backward on the chunk: its saved state is spent, and a later take_from
      // would carry it into another microbatch's slot, held until that one's backward.
      drop_saved_activations(chunk_of(action));
    } else {
      here.output = {std::move(y), std::move(carried)};
    }
  }

  /// The first stage's forward, on the model's input for the microbatch.
  X forward_first(pipeline_action const& action, slot_type& here) {
    In in = input_(action.microbatch);
    X y = forward(chunk_of(action), in);
    if (recompute_) here.recompute_first = std::move(in);
    return y;
  }

  /// Any other stage's forward, on the activation received from the stage before.
  X forward_rest(pipeline_action const& action, slot_type& here) {
    X x = std::move(here.input.stream);
    here.input.stream = X{};
    X y = forward(chunk_of(action), x);
    if (recompute_) here.recompute_from = std::move(x);
    return y;
  }

  /// B: the backward with the layers' weight-gradient work put off into the slot, for W. Not under FSDP, whose
  /// hooks reduce-scatter the gradients as each unit's backward ends: there B is the whole backward, W nothing.
  void backward_input_of(pipeline_action const& action) {
    if constexpr (std::is_same_v<Driver, no_pipeline_driver>) {
      defer_weight_gradients const into(chunk_of(action), slot(action).weight_work);
      backward_of(action);
    } else {
      backward_of(action);
    }
  }

  void backward_of(pipeline_action const& action) {
    driver_.shardwise_pipeline_backward();
    auto& here = slot(action);
    if (recompute_) {  // the same code on the same numbers: bit for bit
      announce_microbatch(chunk_of(action), action.microbatch);
      if (shape_.is_first(stage_of(action)))
        (void)forward(chunk_of(action), here.recompute_first);
      else
        (void)forward(chunk_of(action), here.recompute_from);
      here.recompute_from = X{}, here.recompute_first = In{};
    } else {
      here.kept.give_back(chunk_of(action));
    }
    nn::vector<double> carried;
    if constexpr (carries<Chunk>)
      carried =
          chunk_of(action).shardwise_pipeline_carry(here.gradient.carried, pipeline_pass::backward, action.microbatch);
    X dx = backward(chunk_of(action), here.gradient.stream);
    here.gradient = {};
    drop_saved_activations(chunk_of(action));  // this microbatch's activations are done
    if (!shape_.is_first(stage_of(action))) here.input_gradient = {std::move(dx), std::move(carried)};
  }

  /// Sends `data` to the stage `step` away (+1: next, -1: previous); handed over in place when this rank holds
  /// that stage too (one rank with interleaved chunks).
  /// What the chunks carry goes as a second message under the same tag, which arrives after the first.
  void send(pipeline_action const& action, stage_message<X>& data, int step,
            stage_message<X> slot_type::* destination) {
    int const stage = stage_of(action) + step;
    if (action.peer == rank_) {
      slot_at(shape_.chunk_of(stage), action.microbatch).*destination = std::move(data);
    } else {
      int const t = tag(action.microbatch, stage, step < 0);
      post_send(pp_, data.stream.local, action.peer, t);  // proven with buffered sends
      if constexpr (carries<Chunk>) post_send(pp_, data.carried, action.peer, t);
    }
    data = {};
  }

  void receive(pipeline_action const& action, stage_message<X>& into) {
    bool const gradient = action.kind == action_kind::recv_gradient;
    if (action.peer == rank_) return;
    int const t = tag(action.microbatch, stage_of(action), gradient);
    recv(pp_, into.stream.local, action.peer, t);
    if constexpr (carries<Chunk>) recv(pp_, into.carried, action.peer, t);
  }

  /// The message tag of (microbatch, receiving stage, direction): distinct per message between two ranks, so a
  /// receive takes only the message it names. The receiving stage, because sender and receiver number their
  /// chunks differently (with interleaving, chunk 0 of the last rank feeds chunk 1 of the first).
  int tag(int microbatch, int receiving_stage, bool gradient) const {
    return (microbatch * shape_.model_stages() + receiving_stage) * 2 + (gradient ? 1 : 0);
  }

  Mesh const& pp_;
  pipeline_shape shape_;
  int rank_;
  std::span<Chunk> chunks_;
  Input& input_;
  LossGradient& loss_gradient_;
  bool recompute_;
  Driver& driver_;
  std::vector<std::vector<slot_type>> slots_;
};

/// Compares the step's terms across the pipeline axis (one small gather): every rank raises the same error,
/// naming each rank's terms, when they differ.
template <class Schedule, class Mesh>
void agree_on_step(Mesh const& pp, int microbatches) {
  pipeline_step_terms mine;
  copy_tail(type_name<Schedule>(), mine.schedule);
  mine.microbatches = microbatches;
  mine.chunks = Schedule::chunks_per_rank;
  auto const all = gather_values(pp.comm(0), mine);
  if (std::all_of(all.begin(), all.end(), [&](auto const& t) { return t.same(all.front()); })) return;
  std::string ranks;
  for (std::size_t q = 0; q < all.size(); ++q)
    ranks += concat(q ? "; " : "", "rank ", q, " runs ", text_of(all[q].schedule), " with ", all[q].microbatches,
                    " microbatches and ", all[q].chunks, all[q].chunks == 1 ? " chunk" : " chunks", " per rank");
  fail("shardwise::run_pipeline_step: the ranks of pipeline axis \"", pp.comm(0).label(),
       "\" run different steps: ", ranks,
       ". Every rank must run the same schedule with the same microbatches and chunks in each step");
}

/// The ranks agree on a step whose schedule was proven for Stages stages and Microbatches microbatches.
template <class Schedule, int Stages, int Microbatches, class Mesh>
void agree_on_checked_step(Mesh const& pp) {
  if (pp.size() != Stages)
    fail("shardwise::run_pipeline_step: the schedule was proven for ", Stages, " stages but the pipeline axis has ",
         pp.size(), " ranks; prove it for ", pp.size(), " (sw::checked_schedule<Schedule, ", pp.size(), ", ",
         Microbatches, ">)");
  agree_on_step<Schedule>(pp, Microbatches);
}

/// The step itself, once the schedule is known to run: this rank's action table drives its chunks.
template <pipeline_schedule Schedule, class Mesh, class Chunk, class Input, class LossGradient, class Driver>
void run_checked_step(Schedule const& schedule, Mesh const& pp, std::span<Chunk> chunks, int microbatches, Input& input,
                      LossGradient& loss_gradient, pipeline_options options, Driver& driver) {
  int const stages = pp.size();
  pipeline_shape const shape = shape_of<Schedule>(stages, microbatches);
  if (microbatches * shape.model_stages() * 2 > max_tag + 1)
    fail("shardwise::run_pipeline_step: ", microbatches, " microbatches over ", shape.model_stages(),
         " stages need more message tags than the mesh has (", max_tag + 1, "); use fewer microbatches per step");
  if (chunks.size() != static_cast<std::size_t>(shape.chunks_per_rank))
    fail("shardwise::run_pipeline_step: rank ", pp.rank(), " holds ", chunks.size(),
         " model chunks but the schedule runs ", shape.chunks_per_rank,
         " per rank; give each rank one chunk per schedule chunk");
  using In = std::remove_cvref_t<decltype(input(0))>;
  using X = stage_output_t<Chunk, In>;
  if constexpr (!stages_chain<Chunk, X>()) {
    using shown [[maybe_unused]] = decltype(show_incomplete<stage_output_is_not_the_next_stage_input<X>>());
  }
  static_assert(stages_chain<Chunk, X>(),
                "shardwise::run_pipeline_step: a stage boundary does not chain: the chunk's forward on its own "
                "output (or its backward on that output's gradient) does not give the same activation type, so "
                "the next stage would receive another layout than the one this stage sends; make the stage end "
                "in the layout it starts with (the plan's residual-stream layout)");
  pipeline_step<Mesh, Chunk, In, X, Input, LossGradient, Driver> step(pp, shape, chunks, input, loss_gradient, options,
                                                                      driver);
  for (pipeline_action const& action : schedule.actions(pp.rank(), stages, microbatches)) step.run(action);
  finish_posted_sends(pp);
  for (Chunk& chunk : chunks) {  // what the stages settle between them once a step (tied weights' gradients)
    if constexpr (requires { chunk.shardwise_after_pipeline_step(pp, shape); })
      chunk.shardwise_after_pipeline_step(pp, shape);
    else if constexpr (requires { chunk.shardwise_after_pipeline_step(pp); })
      chunk.shardwise_after_pipeline_step(pp);
  }
}

/// The step of a fully sharded model's chunks: its units gathered and reduced around the actions; the hooks
/// stop acting if the step throws.
template <pipeline_schedule Schedule, class Mesh, pipeline_driver Sharded, class Input, class LossGradient>
void run_sharded_step(Schedule const& schedule, Mesh const& pp, Sharded& sharded, int microbatches, Input& input,
                      LossGradient& loss_gradient, pipeline_options options) {
  struct abandon_unless_done {
    Sharded& sharded;
    bool done = false;
    ~abandon_unless_done() {
      if (!done) sharded.shardwise_pipeline_abandon();
    }
  } guard{sharded};
  sharded.shardwise_pipeline_begin(options.sharded_gradients == sharded_gradient_reduction::every_microbatch);
  run_checked_step(schedule, pp, sharded.shardwise_pipeline_chunks(), microbatches, input, loss_gradient, options,
                   sharded);
  guard.done = true;
  sharded.shardwise_pipeline_end();
}

/// Plain chunks: refused when they belong to a fully sharded model, whose hooks would find no step of theirs.
template <class Chunk>
void refuse_sharded_chunks(std::span<Chunk> chunks) {
  for (Chunk& chunk : chunks)
    if (hooks_under(chunk))
      fail(
          "shardwise::run_pipeline_step: the chunks belong to a model under sw::fully_shard, whose parameters "
          "are freed between its units' calls; pass the sharded model itself: run_pipeline_step(schedule, pp, "
          "sharded, microbatches, input, loss_gradient)");
}

template <class Chunk>
constexpr bool chunk_is_module() {
  static_assert(module<Chunk>,
                "shardwise::run_pipeline_step: a chunk is not a module (a type with SHARDWISE_CHILDREN) that "
                "sw::forward and sw::backward can call; pass a span of the stages, or, for stages under "
                "sw::fully_shard, the sharded model itself: run_pipeline_step(schedule, pp, sharded, "
                "microbatches, input, loss_gradient)");
  return module<Chunk>;
}

}  // namespace detail

/// Runs this rank's part of one pipeline step on the 1-D mesh `pp` (the pipeline axis), as `schedule` orders
/// it for pp.size() stages and `microbatches` microbatches:
/// - `chunks`: this rank's model chunks; chunk c is stage c * pp.size() + pp.rank() of the model (one chunk
///   unless the schedule interleaves). Each is a module called through sw::forward / sw::backward (its plan
///   entries apply). Its forward on the model's input gives the boundary activation X (the first stage's
///   output); its forward and backward on an X give an X (every stage's output is the next one's input, in the
///   same layout: checked at compile time). The first stage's backward result is dropped.
/// - `input(m)`: microbatch m's input to the model's first stage (called on the rank that holds it): an X, or
///   anything the chunk's forward takes (token ids).
/// - `loss_gradient(m, y)`: on the rank of the last stage, the gradient of microbatch m's loss with respect to
///   its output y, an X (record the loss there; a model whose head follows the stack runs it here, as
///   models::LlamaStage::head_loss does).
/// Parameter gradients accumulate in the chunks, microbatch by microbatch in the order of each rank's table;
/// then each chunk's `shardwise_after_pipeline_step(pp)`, if it has one, runs (LlamaStage sums the gradients of
/// an embedding and output tied across stages there).
/// First the ranks agree on the step (schedule, microbatches, chunks per rank: one small gather), then the
/// schedule is checked on every rank alike (sw::check_schedule), so ranks that would run different steps, or a
/// schedule that would hang, throw on every rank before any data moves (the overload below takes a schedule
/// proven at compile time instead). `options.activations`: keep each microbatch's activations until its backward,
/// or recompute them there from the chunk's input (activation checkpointing per stage; the same numbers).
template <pipeline_schedule Schedule, class Mesh, class Chunk, class Input, class LossGradient>
void run_pipeline_step(Schedule const& schedule, Mesh const& pp, std::span<Chunk> chunks, int microbatches,
                       Input&& input, LossGradient&& loss_gradient, pipeline_options options = {}) {
  if constexpr (detail::chunk_is_module<Chunk>()) {
    detail::refuse_sharded_chunks(chunks);
    detail::agree_on_step<Schedule>(pp, microbatches);
    check_schedule(schedule, pp.size(), microbatches);
    detail::no_pipeline_driver none;
    detail::run_checked_step(schedule, pp, chunks, microbatches, input, loss_gradient, options, none);
  }
}

/// run_pipeline_step over the stages of a fully sharded model (sw::fully_shard of this rank's stage, or of its
/// sw::stage_chunks under an interleaved schedule), FSDP within the pipeline as torchtitan composes them. Each
/// unit is gathered before its module's forward and backward of every microbatch (under full_shard released
/// after each forward), the root unit once for the step; the gradients are reduce-scattered over dp as
/// `options.sharded_gradients` says, and all of them by the step's end (unless set_requires_gradient_sync(false)).
/// Then AdamW::step(sharded, pp) takes the global norm over dp, tp and pp.
template <pipeline_schedule Schedule, class Mesh, detail::pipeline_driver Sharded, class Input, class LossGradient>
void run_pipeline_step(Schedule const& schedule, Mesh const& pp, Sharded& sharded, int microbatches, Input&& input,
                       LossGradient&& loss_gradient, pipeline_options options = {}) {
  detail::agree_on_step<Schedule>(pp, microbatches);
  check_schedule(schedule, pp.size(), microbatches);
  detail::run_sharded_step(schedule, pp, sharded, microbatches, input, loss_gradient, options);
}

/// run_pipeline_step with a schedule proven at compile time for its counts (sw::checked_schedule<Schedule,
/// stages, microbatches>): no table is checked at run time; the pipeline axis must have `stages` ranks.
template <class Schedule, int Stages, int Microbatches, class Mesh, class Chunk, class Input, class LossGradient>
void run_pipeline_step(checked_schedule<Schedule, Stages, Microbatches> const&, Mesh const& pp, std::span<Chunk> chunks,
                       Input&& input, LossGradient&& loss_gradient, pipeline_options options = {}) {
  if constexpr (detail::chunk_is_module<Chunk>()) {
    detail::refuse_sharded_chunks(chunks);
    detail::agree_on_checked_step<Schedule, Stages, Microbatches>(pp);
    detail::no_pipeline_driver none;
    detail::run_checked_step(Schedule{}, pp, chunks, Microbatches, input, loss_gradient, options, none);
  }
}

/// run_pipeline_step over a fully sharded model's stages (above) with a schedule proven at compile time.
template <class Schedule, int Stages, int Microbatches, class Mesh, detail::pipeline_driver Sharded, class Input,
          class LossGradient>
void run_pipeline_step(checked_schedule<Schedule, Stages, Microbatches> const&, Mesh const& pp, Sharded& sharded,
                       Input&& input, LossGradient&& loss_gradient, pipeline_options options = {}) {
  detail::agree_on_checked_step<Schedule, Stages, Microbatches>(pp);
  detail::run_sharded_step(Schedule{}, pp, sharded, Microbatches, input, loss_gradient, options);
}

}  // namespace shardwise

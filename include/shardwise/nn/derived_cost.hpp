#pragma once
// A module's cost from its own code (sw::derived_cost): the module built with the element type sw::meta<T> runs
// its forward and backward on shape-only activations, and what its layers record, what it keeps from forward to
// backward and the most its backward holds at once are its cost on one rank. Nothing restates the order its code
// calls its children in; it takes microseconds whatever the sizes. A whole model runs the same way from token
// ids (sw::derived_model_cost); its repeated blocks are stored once (detail::repeated_call).
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "shardwise/cost/meta_trace.hpp"
#include "shardwise/nn/meta.hpp"
#include "shardwise/plan/tree.hpp"

namespace shardwise {

namespace detail {
/// A shape-only module set up for `tp` ranks as sw::parallelize sets up the real one: every module's
/// on_parallelize hook, parents before children (the Llama attention repeats its key-value heads there).
template <class Node>
constexpr void set_up_shapes_for(Node& node, int tp) {
  if constexpr (requires { node.shardwise_on_parallelize(1); }) node.shardwise_on_parallelize(tp);
  if constexpr (requires { node.shardwise_children(); }) {
    auto children = node.shardwise_children();
    [&]<std::size_t... I>(std::index_sequence<I...>) {  // not std::apply: its invoke traits cost compile time
      (set_up_shapes_for(std::get<I>(children), tp), ...);
    }(std::make_index_sequence<std::tuple_size_v<decltype(children)>>{});
  } else if constexpr (repeated<Node>::value) {
    for (auto& element : node) set_up_shapes_for(element, tp);
  } else if constexpr (optional_child<Node>::value) {
    if (node) set_up_shapes_for(*node, tp);
  }
}

/// Runs `backward()` as a backward on shapes: what it records is the backward's (a forward run again now, as
/// checkpointing does, too), and the most it holds at once beyond what was live before is the working bytes.
template <class Backward>
constexpr void run_backward_on_shapes(meta_trace& trace, Backward&& backward) {
  trace.reset_peak();
  std::size_t const held = trace.live;
  trace.start_backward();
  backward();
  trace.total.working_bytes = trace.peak - held;
}

/// The stream of [s.tokens, features] a pipeline stage receives from the stage before, in Stream's layout.
template <class Stream>
constexpr Stream received_stream(meta_trace& trace, std::size_t features) {
  using T = typename Stream::element_type::element;
  using In = typename Stream::placement;
  cost_inputs const& s = trace.inputs;
  return {meta_matrix<T>(meta_rows<In>(s), meta_cols<In>(features, s.tp, s.tp_rank), &trace)};
}

/// What runs around a step's passes on shapes besides the model: nothing, or FSDP's schedule.
struct no_pass_hooks {
  constexpr void begin_forward() {}
  constexpr void end_forward() {}
  constexpr void begin_backward() {}
  constexpr void end_backward() {}
};

/// Runs `microbatches` training passes of `model` on shapes — its forward on trace.inputs.tokens token ids,
/// loss(logits, ids) (which returns the logits' gradient), its backward — with `around`'s members at the passes'
/// ends, and appends each microbatch's record to `list` in order (before what end_backward adds there).
template <std::size_t Capacity, class Model, class Loss, class Around>
constexpr void run_passes_on_shapes(Model& model, meta_trace& trace, std::size_t microbatches, Loss& loss,
                                    Around& around, transfer_list<Capacity>& list) {
  for (std::size_t m = 0; m < microbatches; ++m) {
    meta_ids const ids{trace.inputs.tokens, &trace};
    around.begin_forward();
    auto logits = model.forward(ids);
    around.end_forward();
    auto const dlogits = loss(std::move(logits), ids);
    trace.start_backward();
    around.begin_backward();
    model.backward(dlogits);
    trace.take_record(list);
    around.end_backward();
  }
}

/// Runs `module`'s forward on `input` and its backward on a gradient of its output's shape, recording in `trace`
/// what sw::derived_cost describes.
template <class Module, class Input>
constexpr void run_on_shapes(Module& module, Input const& input, meta_trace& trace) {
  std::size_t const before = trace.live;
  auto y = module.forward(input);
  trace.total.activation_bytes = trace.live - before - y.local.bytes();
  auto const dy = y;  // the output's gradient: its shape and layout
  run_backward_on_shapes(trace, [&] {
    if constexpr (std::is_void_v<decltype(module.backward(dy))>) {
      module.backward(dy);
    } else {
      auto dx = module.backward(dy);
    }
  });
}
}  // namespace detail

/// The cost (sw::cost) on one rank of a module, for s.tokens tokens: Module (built with the element type
/// sw::meta<T>, from `args`, then set up for s.tp ranks by its modules' on_parallelize hooks as sw::parallelize
/// sets up the real one) runs its own forward on an input of [tokens, features] in the layout Input has
/// (an sw::Activation<sw::meta<T>, Layout>), then its backward on a gradient of its output's shape. Transfers: what
/// its layers record as its code calls them; parameters and gradients: each layer's once; activation bytes: what
/// it and its layers keep after the forward; working bytes: the most its backward holds at once beyond that and
/// the gradient it is given (its result included).
template <class Module, class Input, class... Args>
constexpr cost derived_cost(cost_inputs const& s, std::size_t features, Args&&... args) {
  using T = typename Input::element_type::element;
  using In = typename Input::placement;
  meta_trace trace{s};
  {
    Module module(std::forward<Args>(args)...);
    detail::set_up_shapes_for(module, static_cast<int>(s.tp));
    Input x{meta_matrix<T>(detail::meta_rows<In>(s), detail::meta_cols<In>(features, s.tp, s.tp_rank), &trace)};
    detail::run_on_shapes(module, x, trace);
  }
  return trace.finish();
}

/// The cost (sw::cost) on one rank of a whole model, whose forward takes s.tokens token ids (sw::token_ids_t) and
/// whose backward takes its output's gradient: Model (built with the element type sw::meta<T> from `args`, set
/// up as by sw::derived_cost, then handed to `prepare`: `model.checkpoint_blocks(true)`, say) runs its own
/// forward and backward on shapes. The same figures as sw::derived_cost; a forward its backward runs again
/// (activation checkpointing) counts among the backward's transfers.
template <class Model, class Prepare, class... Args>
constexpr cost derived_model_cost(cost_inputs const& s, Prepare&& prepare, Args&&... args) {
  meta_trace trace{s};
  {
    Model model(std::forward<Args>(args)...);
    detail::set_up_shapes_for(model, static_cast<int>(s.tp));
    std::forward<Prepare>(prepare)(model);
    detail::run_on_shapes(model, meta_ids{s.tokens, &trace}, trace);
  }
  return trace.finish();
}

/// The transfers of `microbatches` training passes of a whole model on one rank, in the order they run: per
/// microbatch its forward on s.tokens token ids, `loss(logits, ids)` (which returns the logits' gradient:
/// models::llama_loss, say) and its backward (a forward checkpointing runs again included). Model (built with the
/// element type sw::meta<T> from `args`, set up as by sw::derived_cost, then handed to `prepare`) runs its own
/// code on shapes, as in sw::derived_model_cost; the optimizer's step is the caller's to add
/// (sw::finish_gradients_cost, AdamW::step_cost). Capacity: the entries the result holds (repeats stored once).
template <class Model, std::size_t Capacity = 128, class Prepare, class Loss, class... Args>
constexpr transfer_list<Capacity> derived_passes(cost_inputs const& s, std::size_t microbatches, Prepare&& prepare,
                                                 Loss&& loss, Args&&... args) {
  meta_trace trace{s};
  transfer_list<Capacity> list;
  {
    Model model(std::forward<Args>(args)...);
    detail::set_up_shapes_for(model, static_cast<int>(s.tp));
    std::forward<Prepare>(prepare)(model);
    detail::no_pass_hooks around;
    detail::run_passes_on_shapes(model, trace, microbatches, loss, around, list);
  }
  return list;
}

/// The cost (sw::cost) on one rank of a pipeline stage for one microbatch of s.tokens tokens, its own code run on
/// shapes as sw::run_pipeline_step runs it: Stage (built with the element type sw::meta<T> from `args`, set up as
/// by sw::derived_cost, then handed to `prepare`) runs forward on token ids when it is the first stage, else on
/// the stream of [tokens, features] the stage before sends (Stream: an sw::Activation<sw::meta<T>, Layout>); with
/// `head` on the last stage, head_loss right after (its transfers are the forward's); then backward from the
/// stream's gradient. Activation bytes: what the forward keeps (not the head's, which head_loss spends).
template <class Stage, class Stream, class Prepare, class... Args>
constexpr cost derived_stage_cost(cost_inputs const& s, std::size_t features, bool head, Prepare&& prepare,
                                  Args&&... args) {
  meta_trace trace{s};
  {
    Stage stage(std::forward<Args>(args)...);
    detail::set_up_shapes_for(stage, static_cast<int>(s.tp));
    std::forward<Prepare>(prepare)(stage);
    meta_ids const ids{s.tokens, &trace};
    std::size_t const before = trace.live;
    // What the stage before sends, which the stage keeps only where its code does.
    Stream h = stage.is_first() ? stage.forward(ids) : stage.forward(detail::received_stream<Stream>(trace, features));
    trace.total.activation_bytes = trace.live - before - h.local.bytes();
    Stream dh = head && stage.is_last() ? stage.head_loss(trace, h, ids).gradient : h;
    detail::run_backward_on_shapes(trace, [&] { Stream dx = stage.backward(std::move(dh)); });
  }
  return trace.finish();
}

}  // namespace shardwise

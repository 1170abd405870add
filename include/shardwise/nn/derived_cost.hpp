#pragma once
// A module's cost from its own code (sw::derived_cost): the module built with the element type sw::meta<T> runs
// its forward and backward on shape-only activations, and what its layers record, what it keeps from forward to
// backward and the most its backward holds at once are its cost on one rank. Nothing restates the order its code
// calls its children in; it takes microseconds whatever the sizes.
#include <cstddef>
#include <tuple>
#include <utility>

#include "shardwise/cost/meta_trace.hpp"
#include "shardwise/nn/meta.hpp"

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
  }
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
    std::size_t const before = trace.live;
    auto y = module.forward(x);
    trace.total.activation_bytes = trace.live - before - y.local.bytes();
    auto const dy = y;  // the output's gradient: its shape and layout
    trace.reset_peak();
    std::size_t const held = trace.live;
    {
      auto dx = module.backward(dy);
    }
    trace.total.working_bytes = trace.peak - held;
  }
  return trace.total;
}

}  // namespace shardwise

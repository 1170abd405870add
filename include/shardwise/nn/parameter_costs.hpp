#pragma once
// The cost model's walk of a model's parameters, from the model's own types and shapes: the children of each
// module in the order of SHARDWISE_CHILDREN (the order sw::for_each_parameter walks), each layer's parameters as
// its style cuts them, and the sizes from the module's shardwise_shapes, which its constructor builds the
// children from. A compile-time walk: the cost model stays constexpr, and no model lists its parameters by hand.
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "shardwise/cost/cost.hpp"
#include "shardwise/nn/shapes.hpp"
#include "shardwise/plan/tree.hpp"

namespace shardwise {

namespace detail {
template <class S>
inline constexpr bool is_repeated_shape = false;
template <class S>
inline constexpr bool is_repeated_shape<repeated_shape<S>> = true;

template <class Children>
struct child_types;
template <class... C>
struct child_types<std::tuple<C&...>> {
  template <std::size_t I>
  using at = std::remove_cvref_t<std::tuple_element_t<I, std::tuple<C...>>>;
  static constexpr std::size_t size = sizeof...(C);
};
}  // namespace detail

/// Calls fn(sw::parameter_cost) for each parameter of a node of type Node and shape `shape` on one rank, in the
/// order of sw::for_each_parameter: a layer's from its style (Layer::shardwise_parameter_costs(shape, inputs,
/// fn)); a module's children's in the order of SHARDWISE_CHILDREN, `shape` holding one shape per child (as the
/// module's static constexpr shardwise_shapes gives them); a repeated or optional child's `shape.count` times
/// (sw::repeated_shape, sw::only_if).
template <class Node, class Shape, class Fn>
constexpr void parameter_costs(Shape const& shape, cost_inputs const& s, Fn&& fn) {
  if constexpr (detail::is_repeated_shape<Shape>) {
    using Each = std::conditional_t<detail::container_child<Node>, detail::contained_t<Node>, Node>;
    for (std::size_t i = 0; i < shape.count; ++i) parameter_costs<Each>(shape.each, s, fn);
  } else if constexpr (layer<Node>) {
    constexpr bool walks = requires { Node::shardwise_parameter_costs(shape, s, fn); };
    static_assert(walks,
                  "shardwise::parameter_costs: a layer has no shardwise_parameter_costs for the shape its module's "
                  "shardwise_shapes gives it; give a Linear a sw::linear_shape, an Embedding a sw::embedding_shape, "
                  "a norm a sw::norm_shape (or give a layer of your own a static shardwise_parameter_costs)");
    if constexpr (walks) Node::shardwise_parameter_costs(shape, s, fn);
  } else if constexpr (!module<Node>) {
    static_assert(module<Node>,
                  "shardwise::parameter_costs: a child is neither a layer nor a module (SHARDWISE_CHILDREN); a "
                  "vector or optional child takes a sw::repeated_shape (sw::only_if) in its module's "
                  "shardwise_shapes");
  } else {
    using children = detail::child_types<detail::children_t<Node>>;
    constexpr bool aligned = std::tuple_size_v<Shape> == children::size;
    static_assert(aligned,
                  "shardwise::parameter_costs: a module's shardwise_shapes gives a different number of shapes than "
                  "its SHARDWISE_CHILDREN lists children; give one shape per child, in the children's order");
    if constexpr (aligned)
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (parameter_costs<typename children::template at<I>>(std::get<I>(shape), s, fn), ...);
      }(std::make_index_sequence<children::size>{});
  }
}

/// How many parameters parameter_costs<Node>(shape, s, fn) walks.
template <class Node, class Shape>
constexpr std::size_t parameter_count(Shape const& shape, cost_inputs const& s = {}) {
  std::size_t n = 0;
  parameter_costs<Node>(shape, s, [&](parameter_cost const&) { ++n; });
  return n;
}

}  // namespace shardwise

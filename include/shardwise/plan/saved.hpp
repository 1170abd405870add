#pragma once
// What a module's forward keeps for its backward, named once (SHARDWISE_SAVED), so that several microbatches
// can be in flight: after a microbatch's forward its activations are moved out of the modules into a
// saved_activations object, and moved back before its backward. The modules stay plain code with plain
// members; moving swaps buffers (Eigen matrices, vectors), so no activation is copied.
#include <array>
#include <cstddef>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardwise/core/show.hpp"
#include "shardwise/plan/module.hpp"

namespace shardwise {

namespace detail {

/// A node whose forward-to-backward members are named (SHARDWISE_SAVED).
template <class N>
concept declares_saved = requires(N& n) { n.shardwise_saved(); };

/// Shown in the compile error of a module or layer that does not name what its forward keeps.
template <class Node>
struct module_does_not_declare_saved_activations;

template <class Node>
using own_saved_t = decltype(std::declval<Node&>().shardwise_saved());  // a tuple of references

/// The values of a tuple of references.
template <class Refs>
struct values_of;
template <class... R>
struct values_of<std::tuple<R...>> {
  using type = std::tuple<std::remove_cvref_t<R>...>;
};

template <class Node>
struct saved_store;

/// The store of a node: its own saved values and its children's stores, shaped like the tree.
template <class Node>
using saved_store_t = typename saved_store<std::remove_cvref_t<Node>>::type;

template <class Node>
struct saved_store {
  static auto pick() {
    if constexpr (layer<Node>) {
      return std::type_identity<std::tuple<typename values_of<own_saved_t<Node>>::type>>{};
    } else if constexpr (module<Node>) {
      return []<std::size_t... I>(std::index_sequence<I...>) {
        return std::type_identity<std::tuple<typename values_of<own_saved_t<Node>>::type,
                                             saved_store_t<std::tuple_element_t<I, children_t<Node>>>...>>{};
      }(std::make_index_sequence<std::tuple_size_v<children_t<Node>>>{});
    } else if constexpr (repeated<Node>::value) {
      return std::type_identity<std::vector<saved_store_t<typename repeated<Node>::element>>>{};
    } else if constexpr (optional_child<Node>::value) {
      return std::type_identity<saved_store_t<typename optional_child<Node>::element>>{};
    } else {
      return std::type_identity<std::tuple<>>{};
    }
  }
  using type = typename decltype(pick())::type;
};

/// Swaps every saved member under `node` with its place in `store` (which grows to fit repeated children).
template <class Node, class Store>
constexpr void swap_saved(Node& node, Store& store) {
  using N = std::remove_cvref_t<Node>;
  if constexpr (layer<N> || module<N>) {
    auto members = node.shardwise_saved();
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      using std::swap;
      (swap(std::get<I>(members), std::get<I>(std::get<0>(store))), ...);
    }(std::make_index_sequence<std::tuple_size_v<decltype(members)>>{});
    if constexpr (module<N>) {
      auto children = node.shardwise_children();
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (swap_saved(std::get<I>(children), std::get<I + 1>(store)), ...);
      }(std::make_index_sequence<std::tuple_size_v<decltype(children)>>{});
    }
  } else if constexpr (repeated<N>::value) {
    store.resize(node.size());
    for (std::size_t i = 0; i < node.size(); ++i) swap_saved(node[i], store[i]);
  } else if constexpr (optional_child<N>::value) {
    if (node) swap_saved(*node, store);
  }
}

/// The first node type under Node (in tree order) that does not declare what it saves; void if none.
template <class List>
struct first_undeclared {
  using type = void;
};
template <class N, class... Rest>
struct first_undeclared<type_list<N, Rest...>> {
  using type = std::conditional_t<declares_saved<N>, typename first_undeclared<type_list<Rest...>>::type, N>;
};

/// Whether every module and layer under Node names its saved members; the compile error names the first
/// that does not.
template <class Node>
constexpr bool check_saved_declared() {
  using missing = typename first_undeclared<tree_nodes_t<Node>>::type;
  constexpr bool ok = std::is_void_v<missing>;
  if constexpr (!ok) {
    using shown [[maybe_unused]] = decltype(show_incomplete<module_does_not_declare_saved_activations<missing>>());
  }
  static_assert(ok,
                "shardwise::saved_activations: a module or layer of the tree does not name what its forward keeps "
                "for its backward, so a second microbatch's forward would overwrite it; add "
                "SHARDWISE_SAVED(members...) to it (SHARDWISE_SAVED() if it keeps nothing)");
  return ok;
}

}  // namespace detail

/// The activations that a module tree's forward kept for its backward, held outside the modules, so that the
/// tree can run other microbatches' forwards before this one's backward (pipeline schedules), or drop them
/// (activation checkpointing). Every module and layer under Node must name its saved members with
/// SHARDWISE_SAVED; shardwise's layers and models do.
/// \code
///   sw::saved_activations<Stage> first, second;
///   stage.forward(x0); first.take_from(stage);
///   stage.forward(x1); second.take_from(stage);
///   first.give_back(stage); stage.backward(dy0);
///   second.give_back(stage); stage.backward(dy1);
/// \endcode
template <class Node>
class saved_activations {
  static_assert(detail::check_saved_declared<Node>());

 public:
  /// Moves the activations of node's last forward here (the node keeps empty or stale buffers, which its next
  /// forward overwrites).
  constexpr void take_from(Node& node) { detail::swap_saved(node, store_); }
  /// Moves them back into the node, ready for its backward.
  constexpr void give_back(Node& node) { detail::swap_saved(node, store_); }

 private:
  detail::saved_store_t<Node> store_{};
};

/// Frees what node's last forward kept for its backward (activation checkpointing: the forward runs again
/// before the backward).
template <class Node>
constexpr void drop_saved_activations(Node& node) {
  saved_activations<Node> dropped;
  dropped.take_from(node);
}

}  // namespace shardwise

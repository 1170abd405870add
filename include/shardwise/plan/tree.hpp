#pragma once
// The module tree: what a module, a layer and a container child (a vector, array, optional, a pipeline stage's
// slice of blocks, a rank's stage chunks) are, and the one walk over them that parallelize, the parameter walks,
// optimizers and checkpoints share.
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardwise/plan/hooks.hpp"
#include "shardwise/plan/members.hpp"

namespace shardwise {

/// A module: has children named with SHARDWISE_CHILDREN.
template <class M>
concept module = requires(M& m) {
  { M::shardwise_child_list } -> std::convertible_to<std::string_view>;
  m.shardwise_children();
};

/// How a layer type that is not shardwise's joins plans and parallelize, without changing the type:
/// \code
///   template <> struct shardwise::layer_traits<MyLinear> {
///     using location = ...;                                   // what layer_at<Plan, "name"> gave it
///     template <class Mesh> static void parallelize(MyLinear&, Mesh const& tp);  // keep this rank's shard
///   };
/// \endcode
template <class L>
struct layer_traits {};

namespace detail {
template <class L>
concept member_layer = requires { typename L::shardwise_location; };
template <class L>
concept traits_layer = requires { typename layer_traits<L>::location; };

template <class L>
struct location_of {
  using type = typename layer_traits<L>::location;
};
template <member_layer L>
struct location_of<L> {
  using type = typename L::shardwise_location;
};
}  // namespace detail

namespace detail {
/// What a library layer declares as its shardwise_core: the class that keeps its parameters and state (Core), and
/// the layer that says so (Layer), so that a class derived from the layer, which may add to it, is not taken for it.
template <class Layer, class Core>
struct core_of {
  using layer = Layer;
  using type = Core;
};

/// The class a layer keeps its parameters and state in: a library layer's core (one class per element type and
/// style, whatever path the plan gives the layer), else the layer itself. Walks that need no more than that compile
/// their per-layer code once per core instead of once per layer of every plan.
template <class L>
struct layer_core {
  using type = L;
};
template <class L>
  requires std::is_same_v<typename L::shardwise_core::layer, L>
struct layer_core<L> {
  using type = typename L::shardwise_core::type;
};
template <class L>
using layer_core_t = typename layer_core<L>::type;
}  // namespace detail

/// A layer: the leaves a plan styles. It knows its place in the plan and takes its group in parallelize,
/// through its own members (shardwise's layers) or through layer_traits (anyone's).
template <class L>
concept layer = detail::member_layer<L> || detail::traits_layer<L>;

/// A contiguous slice of a repeated stack of blocks, as a pipeline stage holds it: a vector whose element i is
/// block first + i of the whole model, and is named so in plans, walks and checkpoints ("layers.6.attention"
/// on the stage that holds blocks 6 and 7), so every stage's checkpoint names the model's blocks alike.
template <class T>
struct layer_slice : std::vector<T> {
  std::size_t first = 0;  ///< The model's index of element 0.
};

/// A rank's model chunks under an interleaved pipeline schedule (chunk c is stage c * pp + rank), walked,
/// optimized, saved and loaded as one model: each chunk's parameters keep their own names
/// ("layers.5.attention.wq.weight"), as if the chunks were one stage. A module, so that everything taking a
/// model takes it; run_pipeline_step takes it as its span of chunks.
template <class Chunk>
struct stage_chunks : std::vector<Chunk> {
  /// No named children: the walk visits the chunks themselves, under the path of the whole.
  static constexpr std::string_view shardwise_child_list = "";
  /// Empty: see shardwise_child_list.
  std::tuple<> shardwise_children() { return {}; }
  /// Whether a checkpoint's tensor belongs to no chunk here but to another rank's stages (see load_sharded).
  [[nodiscard]] bool shardwise_other_stage(std::string_view name) const
    requires requires(Chunk const& c) { c.shardwise_other_stage(name); }
  {
    for (auto const& chunk : *this)
      if (!chunk.shardwise_other_stage(name)) return false;
    return true;
  }
  /// The chunks' configuration (the first's; all are cut from one model), saved beside the weights.
  [[nodiscard]] auto shardwise_config() const
    requires requires(Chunk const& c) { c.shardwise_config(); }
  {
    return this->front().shardwise_config();
  }
};

namespace detail {

/// Child i's name from the stringized member list "w1, w3, w2".
constexpr std::string_view child_name(std::string_view list, std::size_t index) {
  std::size_t start = 0;
  for (std::size_t i = 0; i < index; ++i) start = list.find(',', start) + 1;
  std::size_t end = list.find(',', start);
  if (end == std::string_view::npos) end = list.size();
  while (start < end && list[start] == ' ') ++start;
  while (end > start && list[end - 1] == ' ') --end;
  return list.substr(start, end - start);
}

template <class M>
using children_t = decltype(std::declval<M&>().shardwise_children());

template <class T>
struct repeated {
  static constexpr bool value = false;
};
template <class T, class A>
struct repeated<std::vector<T, A>> {
  static constexpr bool value = true;
  using element = T;
};
template <class T, std::size_t N>
struct repeated<std::array<T, N>> {
  static constexpr bool value = true;
  using element = T;
};
template <class T>
struct repeated<layer_slice<T>> {
  static constexpr bool value = true;
  using element = T;
};

template <class T>
struct chunks_of_stages {
  static constexpr bool value = false;
};
template <class T>
struct chunks_of_stages<stage_chunks<T>> {
  static constexpr bool value = true;
  using element = T;
};

/// A child that may be absent (std::optional): walked under its own name when present, skipped when not.
template <class T>
struct optional_child {
  static constexpr bool value = false;
};
template <class T>
struct optional_child<std::optional<T>> {
  static constexpr bool value = true;
  using element = T;
};

/// What a container child holds — the element of a repeated child, an optional one's value type, a rank's
/// stage chunk — or void for any other node: the compile-time walks see through containers to what they hold.
template <class N>
struct contained {
  static auto pick() {
    if constexpr (chunks_of_stages<N>::value)
      return std::type_identity<typename chunks_of_stages<N>::element>{};
    else if constexpr (repeated<N>::value)
      return std::type_identity<typename repeated<N>::element>{};
    else if constexpr (optional_child<N>::value)
      return std::type_identity<typename optional_child<N>::element>{};
    else
      return std::type_identity<void>{};
  }
  using type = typename decltype(pick())::type;
};
template <class N>
using contained_t = typename contained<N>::type;
/// Whether N is a container child (checked before module: stage_chunks is a module too).
template <class N>
inline constexpr bool container_child = !std::is_void_v<contained_t<N>>;

/// The name of element i of a repeated child: its index, counted from the slice's first for a layer_slice.
template <class R>
std::size_t element_number(R const&, std::size_t i) {
  return i;
}
template <class T>
std::size_t element_number(layer_slice<T> const& slice, std::size_t i) {
  return slice.first + i;
}

/// Walking without building names (the optimizer's and parallelize's walks, every step).
struct unnamed {};
inline unnamed child_path(unnamed, std::string_view) { return {}; }
inline unnamed child_path(unnamed, std::size_t) { return {}; }
inline std::string child_path(std::string const& prefix, std::string_view name) {
  return prefix.empty() ? std::string(name) : prefix + "." + std::string(name);
}
inline std::string child_path(std::string const& prefix, std::size_t index) {
  return child_path(prefix, std::to_string(index));
}

/// The one walk over a module tree: on_module(module, path) for every module, outermost first, and
/// on_layer(layer, path) for every layer, in the order of SHARDWISE_CHILDREN; the elements of a repeated child
/// (a vector or array) are named by their index ("layers.0.attention.wq"). Path is std::string or unnamed.
template <class Node, class Path, class OnModule, class OnLayer>
void walk_tree(Node& node, Path const& path, OnModule& on_module, OnLayer& on_layer) {
  using N = std::remove_cvref_t<Node>;
  if constexpr (layer<N>) {
    on_layer(node, path);
  } else if constexpr (chunks_of_stages<N>::value) {
    for (auto& chunk : node) walk_tree(chunk, path, on_module, on_layer);
  } else if constexpr (module<N>) {
    static_assert(hooks_declared<N>);  // its hooks against its SHARDWISE_HOOKS list, with their own messages
    on_module(node, path);
    auto children = node.shardwise_children();
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (walk_tree(std::get<I>(children), child_path(path, child_name(N::shardwise_child_list, I)), on_module, on_layer),
       ...);
    }(std::make_index_sequence<std::tuple_size_v<decltype(children)>>{});
  } else if constexpr (repeated<N>::value) {
    std::size_t i = 0;
    for (auto& element : node) walk_tree(element, child_path(path, element_number(node, i++)), on_module, on_layer);
  } else if constexpr (optional_child<N>::value) {
    if (node) walk_tree(*node, path, on_module, on_layer);
  }
}

inline constexpr auto skip_node = [](auto&, auto const&) {};

/// for_each_layer's and for_each_module's callers of fn: types of their own, not lambdas local to the walk's
/// start, so that walks of a model and of its modules with the same fn share the walk of every sub-module.
template <class Fn>
struct call_on_node {
  Fn& fn;
  template <class Node>
  void operator()(Node& node, unnamed) const {
    fn(node);
  }
};
struct skip_any_node {
  template <class Node, class Path>
  void operator()(Node&, Path const&) const {}
};

/// Calls fn(layer) for every layer under `node` (a layer, a module, or a vector/array of them).
template <class Node, class Fn>
void for_each_layer(Node& node, Fn&& fn) {
  call_on_node<std::remove_reference_t<Fn>> on_layer{fn};
  skip_any_node on_module;
  walk_tree(node, unnamed{}, on_module, on_layer);
}

/// Calls fn(layer, path) for every layer, with its place in the model: "layers.0.attention.wq".
template <class Node, class Fn>
void for_each_named_layer(Node& node, Fn&& fn) {
  auto on_module = skip_node;
  walk_tree(node, std::string(), on_module, fn);
}

/// Calls fn(module) for every module under `node`, outermost first.
template <class Node, class Fn>
void for_each_module(Node& node, Fn&& fn) {
  call_on_node<std::remove_reference_t<Fn>> on_module{fn};
  skip_any_node on_layer;
  walk_tree(node, unnamed{}, on_module, on_layer);
}

}  // namespace detail
}  // namespace shardwise

#pragma once
// Modules name their children once (SHARDWISE_CHILDREN), for plans and checkpoints. parallelize walks the
// children, hands every layer the tensor-parallel group so it can cut its parameters to this rank's shard,
// and checks at compile time that every plan entry reached a layer.
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

#include "shardwise/core/error.hpp"
#include "shardwise/core/show.hpp"
#include "shardwise/mesh/mesh.hpp"
#include "shardwise/plan/members.hpp"
#include "shardwise/plan/plan.hpp"
#include "shardwise/plan/registration.hpp"

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
///     using location = ...;                                   // what style_at<Plan, "name"> gave it
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

/// Calls fn(layer) for every layer under `node` (a layer, a module, or a vector/array of them).
template <class Node, class Fn>
void for_each_layer(Node& node, Fn&& fn) {
  auto on_layer = [&](auto& l, unnamed) { fn(l); };
  auto on_module = skip_node;
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
  auto on_module = [&](auto& m, unnamed) { fn(m); };
  auto on_layer = skip_node;
  walk_tree(node, unnamed{}, on_module, on_layer);
}

/// A plan path found for a node of the tree (a module's is read off its children's).
struct found_path {
  bool found = false;
  std::string_view path;
};

/// `path` minus the last component `name` (and `.*` after it for a repeated child): the parent's path.
constexpr found_path parent_path(std::string_view path, std::string_view name, bool repeated_child) {
  std::string_view const tail = repeated_child ? std::string_view(".*") : std::string_view();
  if (path.size() < name.size() + tail.size() || path.substr(path.size() - tail.size()) != tail) return {};
  path.remove_suffix(tail.size());
  if (path.substr(path.size() - name.size()) != name) return {};
  path.remove_suffix(name.size());
  if (path.empty()) return {true, path};
  if (path.back() != '.') return {};
  path.remove_suffix(1);
  return {true, path};
}

template <class Node>
constexpr found_path node_path();

/// A module's path in its plan, read off the first child whose own path ends with the child's name.
template <class M, std::size_t I = 0>
constexpr found_path module_path() {
  using Children = children_t<M>;
  if constexpr (I == std::tuple_size_v<Children>) {
    return {};
  } else {
    using C = std::remove_cvref_t<std::tuple_element_t<I, Children>>;
    constexpr std::string_view name = child_name(M::shardwise_child_list, I);
    constexpr found_path child = node_path<C>();
    constexpr found_path mine = child.found ? parent_path(child.path, name, repeated<C>::value) : found_path{};
    if constexpr (mine.found)
      return mine;
    else
      return module_path<M, I + 1>();
  }
}

template <class Node>
constexpr found_path node_path() {
  if constexpr (layer<Node>) {
    constexpr std::string_view p = location_of<Node>::type::path.view();
    return {!p.empty(), p};
  } else if constexpr (container_child<Node>) {
    return node_path<contained_t<Node>>();
  } else if constexpr (module<Node>) {
    return module_path<Node>();
  } else {
    return {};
  }
}

template <class... Ts>
struct type_list {};
template <class... Lists>
struct concat_lists {
  using type = type_list<>;
};
template <class... A>
struct concat_lists<type_list<A...>> {
  using type = type_list<A...>;
};
template <class... A, class... B, class... Rest>
struct concat_lists<type_list<A...>, type_list<B...>, Rest...> : concat_lists<type_list<A..., B...>, Rest...> {};

template <class Node>
struct tree_nodes;
/// The one compile-time walk over a module tree: every node type under Node (itself first, then its
/// children's trees in SHARDWISE_CHILDREN order; a vector or array counts as its element type). The checks
/// below are folds over this list.
template <class Node>
using tree_nodes_t = typename tree_nodes<std::remove_cvref_t<Node>>::type;

template <class Node>
struct tree_nodes {
  static auto pick() {
    if constexpr (layer<Node>) {
      return std::type_identity<type_list<Node>>{};
    } else if constexpr (container_child<Node>) {
      return std::type_identity<tree_nodes_t<contained_t<Node>>>{};
    } else if constexpr (module<Node>) {
      return []<std::size_t... I>(std::index_sequence<I...>) {
        return std::type_identity<
            typename concat_lists<type_list<Node>, tree_nodes_t<std::tuple_element_t<I, children_t<Node>>>...>::type>{};
      }(std::make_index_sequence<std::tuple_size_v<children_t<Node>>>{});
    } else {
      return std::type_identity<type_list<>>{};
    }
  }
  using type = typename decltype(pick())::type;
};

/// Whether test.template operator()<N>() holds for some node type N under Node.
template <class Node, class Test>
constexpr bool any_node(Test test) {
  return []<class... N>(Test const& t, type_list<N...>) { return (t.template operator()<N>() || ...); }(
             test, tree_nodes_t<Node>{});
}

/// Whether test.template operator()<N>() holds for every node type N under Node.
template <class Node, class Test>
constexpr bool every_node(Test test) {
  return []<class... N>(Test const& t, type_list<N...>) { return (t.template operator()<N>() && ...); }(
             test, tree_nodes_t<Node>{});
}

/// Whether some layer under Node was looked up at `path`, or a module's own plan entry is there.
template <class Node>
constexpr bool has_layer_at(std::string_view path) {
  return any_node<Node>([path]<class N>() {
    if constexpr (layer<N>) {
      return location_of<N>::type::path.view() == path;
    } else {
      constexpr found_path own = module_path<N>();  // a plan entry for the module itself (PrepareModuleInput)
      return own.found && own.path == path;
    }
  });
}

/// The plan a layer was built with (serial_plan for a module).
template <class N>
struct plan_of_node {
  using type = serial_plan;
};
template <layer N>
struct plan_of_node<N> {
  using type = typename location_of<N>::type::plan;
};

template <class... Ns>
struct first_plan {
  using type = serial_plan;
};
template <class N, class... Rest>
struct first_plan<N, Rest...> {
  using type = std::conditional_t<std::is_same_v<typename plan_of_node<N>::type, serial_plan>,
                                  typename first_plan<Rest...>::type, typename plan_of_node<N>::type>;
};
template <class List>
struct first_plan_in;
template <class... Ns>
struct first_plan_in<type_list<Ns...>> : first_plan<Ns...> {};

/// The plan the layers under Node were built with (serial_plan if there are none).
template <class Node>
using plan_of_tree_t = typename first_plan_in<tree_nodes_t<Node>>::type;

/// For a tp size known at compile time: every layer and module that can check its sizes does.
template <class Node, std::size_t Ranks>
constexpr bool static_sizes_divide() {
  return every_node<Node>([]<class N>() {
    if constexpr (requires { N::template shardwise_static_check<Ranks>(); })
      return N::template shardwise_static_check<Ranks>();
    else
      return true;
  });
}

template <fixed_string Path, class Spelled = spelled_t<Path>>
struct plan_path_matches_no_child;  // incomplete on purpose: the diagnostic spells the path

/// Named in decltype before plan_check's static_assert (see mesh.hpp's show_if_named_twice).
template <class Model, class Entry>
constexpr auto entry_found() {
  constexpr bool found = has_layer_at<Model>(Entry::path.view());
  if constexpr (!found) {
    using offending_path [[maybe_unused]] =
        decltype(detail::show_incomplete<plan_path_matches_no_child<Entry::path>>());
  }
  return found;
}

template <class Model, class Plan>
struct plan_check;
template <class Model, class... Entries>
struct plan_check<Model, plan<Entries...>> {
  static constexpr bool all_found = (has_layer_at<Model>(Entries::path.view()) && ...);
  using missing_paths_shown = decltype((entry_found<Model, Entries>() && ...));
  static_assert(all_found,
                "shardwise::parallelize: a plan path matches no layer of the model; check its spelling against the "
                "names in SHARDWISE_CHILDREN, and use \"*\" for the elements of a repeated child");
};

/// Incomplete on purpose: the diagnostic spells the member's name and the plan path it was declared with.
template <fixed_string MemberName, fixed_string DeclaredPath, class SpelledMember = spelled_t<MemberName>,
          class SpelledPath = spelled_t<DeclaredPath>>
struct member_declared_with_another_path;

template <std::string_view const& Text>
constexpr auto spelled() {
  fixed_string<Text.size() + 1> s;
  for (std::size_t i = 0; i < Text.size(); ++i) s.chars[i] = Text[i];
  return s;
}

template <class M, std::size_t I>
struct child_facts {
  using C = std::remove_cvref_t<std::tuple_element_t<I, children_t<M>>>;
  static constexpr std::string_view name = child_name(M::shardwise_child_list, I);
  static constexpr found_path path = node_path<C>();
  static constexpr std::string_view path_text = path.path;
  static constexpr found_path own = module_path<M>();
  static constexpr found_path parent = path.found ? parent_path(path.path, name, repeated<C>::value) : found_path{};
  // A layer at the module's own path is a Prepare child (the older way of applying a module's plan entry).
  static constexpr bool prepare_child = layer<C> && own.found && path.found && path.path == own.path;
  static constexpr bool ok = !path.found || prepare_child || (parent.found && (!own.found || parent.path == own.path));
};

/// Whether every member's plan path ends with its name in SHARDWISE_CHILDREN: a member declared with another
/// member's path (copied and not renamed) would take that member's style and be saved under its own name.
template <class Node>
constexpr bool children_named_as_declared() {
  return every_node<Node>([]<class N>() {
    if constexpr (module<N>) {
      return []<std::size_t... I>(std::index_sequence<I...>) {
        return (child_facts<N, I>::ok && ...);
      }(std::make_index_sequence<std::tuple_size_v<children_t<N>>>{});
    } else {
      return true;
    }
  });
}

template <class Node>
void show_members_named_otherwise();

template <class Node, std::size_t I>
void show_member_named_otherwise() {
  using F = child_facts<Node, I>;
  if constexpr (!F::ok) {
    constexpr auto member = spelled<F::name>();
    constexpr auto declared = spelled<F::path_text>();
    using offending [[maybe_unused]] =
        decltype(detail::show_incomplete<member_declared_with_another_path<member, declared>>());
  }
  show_members_named_otherwise<typename F::C>();
}

template <class Node, std::size_t... I>
void show_children_named_otherwise(std::index_sequence<I...>) {
  (show_member_named_otherwise<Node, I>(), ...);
}

template <class Node>
void show_members_named_otherwise() {
  if constexpr (container_child<Node>)
    show_members_named_otherwise<contained_t<Node>>();
  else if constexpr (module<Node>)
    show_children_named_otherwise<Node>(std::make_index_sequence<std::tuple_size_v<children_t<Node>>>{});
}

/// Named in decltype beside the static_assert on children_named_as_declared (see mesh.hpp's
/// show_if_named_twice): spells each member declared with another member's path, and that path.
template <class Node>
auto show_members_named_otherwise_in() {
  show_members_named_otherwise<Node>();
  return true;
}

/// Every shardwise layer inside a module's object must be one its children list reaches: a held layer missing
/// from SHARDWISE_CHILDREN would get no shard, no optimizer step and no checkpoint entry. Checked at
/// parallelize (C++ cannot list a class's members at compile time).
template <class Model>
void check_children_listed(Model& model) {
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> reached;  // the walked layers' objects
  auto on_layer = [&](auto& l, unnamed) {
    auto const begin = layer_registry::address(&l);
    reached.emplace_back(begin, begin + sizeof(l));
  };
  auto ignore = skip_node;
  walk_tree(model, unnamed{}, ignore, on_layer);
  auto on_module = [&](auto& m, std::string const& path) {
    layer_registry::instance().for_each_in(
        &m, reinterpret_cast<char const*>(&m) + sizeof(m), [&](std::uintptr_t at, registered_layer_info const& info) {
          for (auto const& [begin, end] : reached)
            if (at >= begin && at < end) return;
          fail("shardwise::parallelize: the module at \"", path, "\" holds a ", info.kind, " (plan path \"", info.path,
               "\") that its SHARDWISE_CHILDREN does not list; add the member to "
               "the list, or it gets no shard, no optimizer step and no "
               "checkpoint entry");
        });
  };
  auto no_layers = skip_node;
  walk_tree(model, std::string(), on_module, no_layers);
}
}  // namespace detail

/// Checks the model's plan against the model at compile time, then lets every layer take its shard over the
/// 1-D mesh `tp` (collective on `tp`). Returns the model for chaining.
template <module Model, class Group>
Model& parallelize(Model& model, Group const& tp) {
  [[maybe_unused]] constexpr bool plan_paths_found =
      detail::plan_check<Model, detail::plan_of_tree_t<Model>>::all_found;
  if constexpr (!detail::children_named_as_declared<Model>()) {  // spelled before the message: see mesh.hpp
    using members_shown [[maybe_unused]] = decltype(detail::show_members_named_otherwise_in<Model>());
  }
  static_assert(detail::children_named_as_declared<Model>(),
                "shardwise::parallelize: a member's plan path does not end with its name in SHARDWISE_CHILDREN; "
                "declare member m with style_at<Plan, \"m\"> (a module: subplan<Plan, \"m\">) so that its plan "
                "entry and its checkpoint name agree");
  detail::check_children_listed(model);
  if constexpr (requires { Group::static_sizes[0]; }) {
    if constexpr (Group::static_sizes[0] != dynamic_size)
      static_assert(detail::static_sizes_divide<Model, Group::static_sizes[0]>());
  }
  // Modules may check what only they know (heads must split whole) before any layer is cut.
  detail::for_each_module(model, [&](auto& m) {
    if constexpr (requires { m.shardwise_on_parallelize(1); }) m.shardwise_on_parallelize(tp.size());
  });
  detail::for_each_layer(model, [&](auto& l) {
    using L = std::remove_cvref_t<decltype(l)>;
    if constexpr (detail::member_layer<L>)
      l.shardwise_parallelize(tp);
    else
      layer_traits<L>::parallelize(l, tp);
  });
  return model;
}

}  // namespace shardwise

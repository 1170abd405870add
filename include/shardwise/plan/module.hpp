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
#include "shardwise/plan/plan_argument.hpp"
#include "shardwise/plan/registration.hpp"
#include "shardwise/plan/tree.hpp"

namespace shardwise {
namespace detail {

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

/// The first Trait<N>::type over the nodes of List (a type_list) that is not void, else void.
template <template <class> class Trait, class List>
struct first_given_in;
template <template <class> class Trait, class... Ns>
struct first_given_in<Trait, type_list<Ns...>> : first_given<Trait, Ns...> {};

/// The plan the model under Node was built with, read off the first node (the model itself, else a module below
/// it) that takes it as a template argument; void if none does. Layers carry only their own style, path and the
/// entries around them, so this is where the whole plan is found for checking its entries against the model.
template <class Node>
using plan_of_tree_t = typename first_given_in<plan_argument, tree_nodes_t<Node>>::type;

/// A layer's entries around it, if it has a path (void otherwise, and for a module).
template <class N>
struct enclosing_of_layer {
  using type = void;
};
template <layer N>
  requires(!location_of<N>::type::path.view().empty())
struct enclosing_of_layer<N> {
  using type = typename location_of<N>::type::enclosing;
};

/// The plan's entries at the modules around the first layer under Node with a path (plan<> if there is none):
/// what sw::forward reads a module's own entry from.
template <class Node>
struct enclosing_of_tree {
  using found = typename first_given_in<enclosing_of_layer, tree_nodes_t<Node>>::type;
  using type = std::conditional_t<std::is_void_v<found>, plan<>, found>;
};
template <class Node>
using enclosing_of_tree_t = typename enclosing_of_tree<Node>::type;

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
/// No node takes the plan as a template argument in a shape plan_argument reads (a template template parameter,
/// say, or a plan fixed inside a class): its entries are not checked against the model. The layers still take
/// their styles from it; a misspelt entry there shards nothing and goes unreported.
template <class Model>
struct plan_check<Model, void> {
  static constexpr bool all_found = true;
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
  static constexpr bool ok = !path.found || (parent.found && (!own.found || parent.path == own.path));
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

/// A module tree as parallelize sees it: one walk lists every module (outermost first) and layer, with its
/// object's extent, its path and what parallelize calls on it, so that its checks and calls are loops.
template <class Group>
struct parallelize_list {
  struct node {
    void const* begin = nullptr;
    std::size_t size = 0;
    std::string path;
    void (*call)(void* object, Group const& tp) = nullptr;  // a module's hook (may be null), a layer's parallelize
    void* object = nullptr;
  };
  std::vector<node> modules, layers;
};

template <class M, class Group>
void call_module_hook(void* m, Group const& tp) {
  static_cast<M*>(m)->shardwise_on_parallelize(tp.size());
}
template <class L, class Group>
void call_layer_parallelize(void* l, Group const& tp) {
  if constexpr (requires(L& layer) { layer.shardwise_parallelize(tp); })
    static_cast<L*>(l)->shardwise_parallelize(tp);
  else
    layer_traits<L>::parallelize(*static_cast<L*>(l), tp);
}

template <class Group, class Model>
parallelize_list<Group> list_for_parallelize(Model& model) {
  parallelize_list<Group> list;
  auto on_module = [&](auto& m, std::string const& path) {
    using M = std::remove_cvref_t<decltype(m)>;
    typename parallelize_list<Group>::node node{&m, sizeof(m), path, nullptr, &m};
    if constexpr (requires { m.shardwise_on_parallelize(1); }) node.call = &call_module_hook<M, Group>;
    list.modules.push_back(std::move(node));
  };
  auto on_layer = [&](auto& l, std::string const& path) {
    using Core = layer_core_t<std::remove_cvref_t<decltype(l)>>;  // its parallelize: compiled once per core
    list.layers.push_back({&l, sizeof(l), path, &call_layer_parallelize<Core, Group>, static_cast<Core*>(&l)});
  };
  walk_tree(model, std::string(), on_module, on_layer);
  return list;
}

/// Every shardwise layer inside a module's object must be one its children list reaches: a held layer missing
/// from SHARDWISE_CHILDREN would get no shard, no optimizer step and no checkpoint entry. Checked at
/// parallelize (C++ cannot list a class's members at compile time).
template <class Group>
void check_children_listed(parallelize_list<Group> const& list) {
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> reached;  // the walked layers' objects
  for (auto const& l : list.layers) {
    auto const begin = layer_registry::address(l.begin);
    reached.emplace_back(begin, begin + l.size);
  }
  for (auto const& m : list.modules) {
    auto const* begin = static_cast<char const*>(m.begin);
    layer_registry::instance().for_each_in(begin, begin + m.size,
                                           [&](std::uintptr_t at, registered_layer_info const& info) {
                                             for (auto const& [first, end] : reached)
                                               if (at >= first && at < end) return;
                                             fail("shardwise::parallelize: the module at \"", m.path, "\" holds a ",
                                                  info.kind, " (plan path \"", info.path,
                                                  "\") that its SHARDWISE_CHILDREN does not list; add the member to "
                                                  "the list, or it gets no shard, no optimizer step and no "
                                                  "checkpoint entry");
                                           });
  }
}
}  // namespace detail

/// A model type that is not a module — it lists no children with SHARDWISE_CHILDREN — has nothing parallelize
/// could cut: refused at compile time with the fix (instead of "no matching function").
template <class Model, class Group>
  requires(!module<Model>)
Model& parallelize(Model& model, Group const&) {
  static_assert(module<Model>,
                "shardwise::parallelize: the model's type lists no children; declare its layers and sub-modules "
                "with SHARDWISE_CHILDREN(a, b, ...) inside the class (a single layer: put it in a module)");
  return model;
}

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
                "declare member m with layer_at<Plan, \"m\"> (a module: subplan<Plan, \"m\">) so that its plan "
                "entry and its checkpoint name agree");
  auto const list = detail::list_for_parallelize<Group>(model);
  detail::check_children_listed(list);
  if constexpr (requires { Group::static_sizes[0]; }) {
    if constexpr (Group::static_sizes[0] != dynamic_size)
      static_assert(detail::static_sizes_divide<Model, Group::static_sizes[0]>());
  }
  // Modules may check what only they know (heads must split whole) before any layer is cut.
  for (auto const& m : list.modules)
    if (m.call) m.call(m.object, tp);
  for (auto const& l : list.layers) l.call(l.object, tp);
  return model;
}

}  // namespace shardwise

#pragma once
// A sharding plan is a type: a compile-time map from child paths ("layers.*.attention.wq") to parallel styles.
// A module places its layers with layer_at<Plan, "w1"> and passes subplan<Plan, "attention"> to
// a child module; every lookup carries its full path, so a layer can name itself in an error and parallelize
// can check that every entry of the plan found a layer.
#include <array>
#include <cstddef>
#include <string_view>
#include <type_traits>

#include "shardwise/core/fixed_string.hpp"
#include "shardwise/core/show.hpp"

namespace shardwise {

/// The style of a layer the plan does not mention: whole parameters on every rank.
struct NoParallel {};

/// One plan entry: the style for the child at Path. "*" stands for every element of a repeated child.
template <fixed_string Path, class Style>
struct at {
  static constexpr auto path = Path;  ///< The child's path ("layers.*.attention.wq").
  using style = Style;                ///< Its parallel style.
};

namespace detail {
template <fixed_string Path, class Spelled = spelled_t<Path>>
struct plan_path_named_twice;  // incomplete on purpose: the diagnostic spells the path
template <class T>
inline constexpr bool is_plan_entry_v = false;
template <fixed_string P, class S>
inline constexpr bool is_plan_entry_v<at<P, S>> = true;

/// Named in decltype before the plan's static_assert (see mesh.hpp's show_if_named_twice).
template <class E, class... Entries>
constexpr auto show_if_path_named_twice() {
  if constexpr (((Entries::path.view() == E::path.view() ? 1 : 0) + ... + 0) != 1) {
    using offending_path [[maybe_unused]] = decltype(detail::show_incomplete<plan_path_named_twice<E::path>>());
  }
  return true;
}
}  // namespace detail

/// A parallelization plan: at<"path", Style> entries, one style per path; a layer no entry names gets
/// NoParallel.
template <class... Entries>
struct plan {
  static_assert((detail::is_plan_entry_v<Entries> && ...),
                "shardwise::plan: every entry must be shardwise::at<\"path\", Style>");
  /// The entries' paths, in order.
  static constexpr std::array<std::string_view, sizeof...(Entries)> paths{Entries::path.view()...};

 private:
  static constexpr bool paths_distinct = [] {
    for (std::size_t i = 0; i < paths.size(); ++i)
      for (std::size_t j = i + 1; j < paths.size(); ++j)
        if (paths[i] == paths[j]) return false;
    return true;
  }();
  using repeated_paths_shown = decltype((detail::show_if_path_named_twice<Entries, Entries...>() && ...));
  static_assert(paths_distinct, "shardwise::plan: two entries name the same path; keep one style per path");
};

/// The plan with nothing sharded: every module built with it is the unsharded reference.
using serial_plan = plan<>;

/// A plan as seen from inside a child module: lookups happen below Prefix.
template <class Root, fixed_string Prefix>
struct scoped_plan {};

namespace detail {
template <class P>
struct plan_parts;
template <class... E>
struct plan_parts<plan<E...>> {
  using root = plan<E...>;
  static constexpr fixed_string<1> prefix{""};
};
template <class Root, fixed_string Prefix>
struct plan_parts<scoped_plan<Root, Prefix>> {
  using root = Root;
  static constexpr auto prefix = Prefix;
};

template <class Root, fixed_string Path>
struct lookup_style;
template <fixed_string Path>
struct lookup_style<plan<>, Path> {
  using type = NoParallel;
};
template <fixed_string Path, class First, class... Rest>
struct lookup_style<plan<First, Rest...>, Path> {
  using type = std::conditional_t<First::path.view() == Path.view(), typename First::style,
                                  typename lookup_style<plan<Rest...>, Path>::type>;
};
}  // namespace detail

namespace detail {
/// Whether `module` is a path around `path` (a proper prefix of it, ending where a component does).
constexpr bool path_encloses(std::string_view module, std::string_view path) {
  return path.size() > module.size() && path.starts_with(module) && path[module.size()] == '.';
}

/// The entries of a plan at modules around Path, in the plan's order, as a plan of their own.
template <fixed_string Path, class Kept, class... Entries>
struct entries_around {
  using type = Kept;
};
template <fixed_string Path, class... Kept, class First, class... Rest>
struct entries_around<Path, plan<Kept...>, First, Rest...>
    : entries_around<
          Path, std::conditional_t<path_encloses(First::path.view(), Path.view()), plan<Kept..., First>, plan<Kept...>>,
          Rest...> {};
template <class Root, fixed_string Path>
struct enclosing_entries;
template <class... Entries, fixed_string Path>
struct enclosing_entries<plan<Entries...>, Path> : entries_around<Path, plan<>, Entries...> {};
}  // namespace detail

/// What the plan says of one layer: its style, its full path, and the plan's entries at the modules around it
/// (PrepareModuleInput and the like, which sw::forward applies to those modules). Not the whole plan: two plans
/// that give a layer the same style at the same path give it the same type.
template <class Style, fixed_string Path, class Enclosing = plan<>>
struct located {
  using style = Style;                ///< The layer's style.
  static constexpr auto path = Path;  ///< The layer's full path from the root of the plan.
  using enclosing = Enclosing;        ///< The plan's entries at modules around the layer, as a plan.
};

/// The plan as seen from inside the child `Name`: what a child module takes as its Plan.
template <class Plan, fixed_string Name>
using subplan =
    scoped_plan<typename detail::plan_parts<Plan>::root, join_path<detail::plan_parts<Plan>::prefix, Name>()>;

/// The layer at the child `Name` of a module built with Plan, as the plan places it: a located (its style, full
/// path and the entries around it), which is what a layer takes (`sw::Linear<T, sw::layer_at<Plan, "w1">>`).
template <class Plan, fixed_string Name>
using layer_at = located<typename detail::lookup_style<typename detail::plan_parts<Plan>::root,
                                                       join_path<detail::plan_parts<Plan>::prefix, Name>()>::type,
                         join_path<detail::plan_parts<Plan>::prefix, Name>(),
                         typename detail::enclosing_entries<typename detail::plan_parts<Plan>::root,
                                                            join_path<detail::plan_parts<Plan>::prefix, Name>()>::type>;

/// The name layer_at had before it said what it gives; kept so that a model written against it still compiles.
template <class Plan, fixed_string Name>
using style_at [[deprecated("shardwise::style_at is now shardwise::layer_at")]] = layer_at<Plan, Name>;

/// The style at the module's own path (for PrepareModuleInput and friends on a whole module).
template <class Plan>
using own_style = layer_at<Plan, "">;

}  // namespace shardwise

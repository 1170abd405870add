#pragma once
// The plan among a module type's template arguments. A layer's type carries only what the plan says of that layer
// (plan.hpp's located), so sw::parallelize reads the whole plan off the model's modules, which take it as a type
// parameter (plan<...> at the root, scoped_plan<Root, Prefix> below), to check its entries against the model.
#include <type_traits>

#include "shardwise/plan/plan.hpp"

namespace shardwise::detail {

/// The first Trait<A>::type over A... that is not void, else void.
template <template <class> class Trait, class... A>
struct first_given {
  using type = void;
};
template <template <class> class Trait, class A, class... Rest>
struct first_given<Trait, A, Rest...> {
  using type = std::conditional_t<std::is_void_v<typename Trait<A>::type>, typename first_given<Trait, Rest...>::type,
                                  typename Trait<A>::type>;
};

/// The root plan a template argument is (plan<...> at the root, scoped_plan<Root, Prefix> below it), else void.
template <class A>
struct as_plan_root {
  using type = void;
};
template <class... Entries>
struct as_plan_root<plan<Entries...>> {
  using type = plan<Entries...>;
};
template <class Root, fixed_string Prefix>
struct as_plan_root<scoped_plan<Root, Prefix>> {
  using type = Root;
};
template <class... A>
using first_plan_root = first_given<as_plan_root, A...>;

// The plan among a module type's template arguments, for the shapes a module's template has: types only, one to
// three types before values, or a value before types. One trait per shape, so that no two partial
// specializations compete for a template that fits both.
template <class M>
struct plan_among_types : first_plan_root<> {};
template <template <class...> class M, class... A>
struct plan_among_types<M<A...>> : first_plan_root<A...> {};
template <class M>
struct plan_before_values1 : first_plan_root<> {};
template <template <class, auto...> class M, class A, auto... V>
struct plan_before_values1<M<A, V...>> : first_plan_root<A> {};
template <class M>
struct plan_before_values2 : first_plan_root<> {};
template <template <class, class, auto...> class M, class A, class B, auto... V>
struct plan_before_values2<M<A, B, V...>> : first_plan_root<A, B> {};
template <class M>
struct plan_before_values3 : first_plan_root<> {};
template <template <class, class, class, auto...> class M, class A, class B, class C, auto... V>
struct plan_before_values3<M<A, B, C, V...>> : first_plan_root<A, B, C> {};
template <class M>
struct plan_after_value : first_plan_root<> {};
template <template <auto, class...> class M, auto V, class... A>
struct plan_after_value<M<V, A...>> : first_plan_root<A...> {};

/// The root plan among M's template arguments (the first that is one), else void.
template <class M>
struct plan_argument {
  using type = typename first_plan_root<typename plan_among_types<M>::type, typename plan_before_values1<M>::type,
                                        typename plan_before_values2<M>::type, typename plan_before_values3<M>::type,
                                        typename plan_after_value<M>::type>::type;
};

}  // namespace shardwise::detail

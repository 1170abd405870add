#pragma once
// A parent calls a child module through the library — y = sw::forward(child, x), dx = sw::backward(child, dy) —
// and the child's own plan entry (PrepareModuleInput / PrepareModuleOutput / PrepareModuleInputOutput at the
// module's path, PyTorch's hooks) is applied around it: the input redistributed to the layouts the module
// wants, its output to the layouts the parent wants, and the gradients back by the conjugate rule. A module
// names no layout. A gradient that comes back Partial<Sum> (the sum of several
// ColwiseParallel layers' partial input gradients) is reduced once, at the boundary, into the input's layout.
//
// The module's path is not declared: it is read off its layers' plan paths ("feed_forward.w1" under the child
// named "w1" puts the module at "feed_forward"). The same call is where FSDP units gather and free their
// parameters (core/module_hooks.hpp) and where activation checkpointing recomputes.
#include <cstddef>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "shardwise/core/fixed_string.hpp"
#include "shardwise/core/module_hooks.hpp"
#include "shardwise/cost/cost.hpp"
#include "shardwise/nn/activation.hpp"
#include "shardwise/nn/layers/layer_common.hpp"
#include "shardwise/nn/layers/styles.hpp"
#include "shardwise/nn/meta.hpp"
#include "shardwise/nn/redistribute.hpp"
#include "shardwise/plan/module.hpp"

namespace shardwise {

namespace detail {

/// A module style's input pair and output pair (Replicate to Replicate where it has none).
template <class S, bool Moves = moves_module_input<S>>
struct module_input_pair {
  using in = Replicate;
  using desired_in = Replicate;
};
template <class S>
struct module_input_pair<S, true> {
  using in = typename S::input_layouts;
  using desired_in = typename S::desired_input_layouts;
};
template <class S, bool Moves = moves_module_output<S>>
struct module_output_pair {
  using out = Replicate;
  using desired_out = Replicate;
};
template <class S>
struct module_output_pair<S, true> {
  using out = typename S::output_layouts;
  using desired_out = typename S::desired_output_layouts;
};

/// What a plan entry at a module's path asks for at the module's boundary: read off its style's members.
template <class S>
struct prepare_layouts {
  static constexpr bool input = false, output = false, known = std::is_same_v<S, NoParallel>;
  using mover = layout_engine;
};
template <module_style S>
struct prepare_layouts<S> : module_input_pair<S>, module_output_pair<S> {
  static constexpr bool input = moves_module_input<S>, output = moves_module_output<S>, known = true;
  using mover = typename S::mover;
};

template <class Key, class... Entries>
struct style_by_path {
  using type = NoParallel;
};
template <class Key, class First, class... Rest>
struct style_by_path<Key, First, Rest...> {
  using type = std::conditional_t<First::path.view() == Key::value, typename First::style,
                                  typename style_by_path<Key, Rest...>::type>;
};
template <class Key, class Plan>
struct style_in_plan;
template <class Key, class... Entries>
struct style_in_plan<Key, plan<Entries...>> : style_by_path<Key, Entries...> {};

template <class M>
struct own_path_key {
  static constexpr found_path where = module_path<M>();
  static constexpr std::string_view value = where.path;
  static constexpr auto spelled = [] {
    fixed_string<value.size() + 1> s;
    for (std::size_t i = 0; i < value.size(); ++i) s.chars[i] = value[i];
    return s;
  }();
};

/// The plan entry at the module's own path (NoParallel if none, or if the module has no planned layers).
template <class M>
using module_style_t =
    std::conditional_t<own_path_key<M>::where.found,
                       typename style_in_plan<own_path_key<M>, enclosing_of_tree_t<M>>::type, NoParallel>;

/// group_under's visitor: the first tensor-parallel group a layer has. A type of its own, so that a module's walk
/// and its sub-modules' share their code (for_each_layer).
template <class T>
struct first_group {
  nn::group<T> const* found = nullptr;
  template <class Layer>
  void operator()(Layer& l) {
    if constexpr (requires { l.shardwise_group(); })
      if (!found) found = l.shardwise_group();
  }
};

/// The tensor-parallel group of the first layer under `node` that has one (null before parallelize).
template <class T, class Node>
nn::group<T> const* group_under(Node& node) {
  first_group<T> find;
  for_each_layer(node, find);
  return find.found;
}

/// hooks_under's visitor: the first hooks a layer carries, a type of its own as first_group is.
struct first_module_hooks {
  module_hooks* found = nullptr;
  template <class Layer>
  void operator()(Layer& l) {
    if constexpr (requires { l.shardwise_module_hooks(); })
      if (!found) found = l.shardwise_module_hooks();
  }
};

/// The hooks the layers under `node` carry (the first layer that has any), null when none do.
template <class Node>
module_hooks* hooks_under(Node& node) {
  first_module_hooks find;
  for_each_layer(node, find);
  return find.found;
}

template <class T, class X>
nn::matrix<T> moved(nn::group<T> const* g, X const& x, std::string_view path) {
  if (!g)
    fail("shardwise::forward at \"", path,
         "\": the module's plan entry moves activations, but no layer under it has its group yet; call "
         "sw::parallelize(model, tp) first");
  return nn::matrix<T>(local_of<T>(x));
}

template <class X>
struct element_of {
  using type = element_t<X>;  // a plain row-major tensor, taken to be in the entry's input layout
};
template <class T, class P>
struct element_of<Activation<T, P>> {
  using type = T;
};
template <class X>
using element_of_t = typename element_of<std::remove_cvref_t<X>>::type;

/// x moved from layout From to layout To at a module's boundary, over the group of the module's layers.
/// Incomplete on purpose: the diagnostic names the module and a boundary move the library cannot make.
template <fixed_string Path, class From, class To, class Spelled = spelled_t<Path>>
struct boundary_cannot_move_at;

template <class Mover, class From, class To, class Key, class Module, class X>
constexpr auto move_at_boundary(Module& module, X const& x) {
  using T = element_of_t<X>;
  using layouts_shown [[maybe_unused]] =
      decltype(show_layout_mismatch<Key::spelled, From, X>());  // names the module and both layouts
  if constexpr (std::is_same_v<Mover, layout_engine> && !activation_layout<To>()) {
    using target_shown [[maybe_unused]] = decltype(show_incomplete<boundary_cannot_move_at<Key::spelled, From, To>>());
  }
  static_assert(is_meta_v<T> || activation_mover<Mover, T>,
                "shardwise::forward: the mover of the plan entry at a module's path must have move<From, To, T> "
                "and add_cost<From, To> (sw::activation_mover); use sw::layout_engine or write both");
  if constexpr (is_meta_v<T>) {  // a shape-only run: the move's cost recorded
    return Activation<T, To>{meta_moved<Mover, From, To>(x.local, x.local.trace()->transfers())};
  } else {
    auto const* g = group_under<T>(module);
    return Activation<T, To>{Mover::template move<From, To, T>(*g, moved<T>(g, x, Key::value))};
  }
}

/// Whether X is a shape-only activation (sw::meta<T> elements).
template <class X>
inline constexpr bool meta_activation_v = false;
template <class T, class P>
inline constexpr bool meta_activation_v<Activation<meta<T>, P>> = true;

/// The hooks around a call of `module` on x (x may be any input: token ids, a tensor): on shapes its trace's.
template <class X, class Module>
constexpr module_hooks* call_hooks(Module& module, X const& x) {
  if constexpr (meta_activation_v<std::remove_cvref_t<X>>)
    return x.local.trace() ? x.local.trace()->hooks : nullptr;
  else
    return hooks_under(module);
}

/// On shapes, the trace a call of a module on x records in, whose repeats detail::repeated_call folds; null on
/// real activations.
template <class X>
constexpr meta_trace* meta_trace_of(X const& x) {
  if constexpr (meta_activation_v<X>)
    return x.local.trace();
  else
    return nullptr;
}

/// On shapes, a gradient moved from From to To at a module's boundary in its backward: its cost recorded.
template <class Mover, class From, class To, class T>
constexpr Activation<T, To> meta_gradient_moved(Activation<T, From> const& dy) {
  return {meta_moved<Mover, From, To>(dy.local, dy.local.trace()->transfers())};
}
}  // namespace detail

/// Calls the module's forward with its plan entry applied: the input moved from the entry's input_layouts to its
/// desired_input_layouts, the output from output_layouts to desired_output_layouts (collective where they
/// differ). Without an entry, it is module.forward(x). Arguments after the input (`context`: a key-value cache
/// and its step, say) go to module.forward unchanged, after it: the plan entry applies to the input only.
template <module Module, class X, class... Context>
constexpr auto forward(Module& module, X const& x, Context&&... context) {
  using S = detail::module_style_t<Module>;
  using L = detail::prepare_layouts<S>;
  using Key = detail::own_path_key<Module>;
  using style_shown [[maybe_unused]] =  // names the module's path and the style (before the message: see mesh.hpp)
      decltype(detail::style_allowed<located<S, Key::spelled>, L::known>());
  static_assert(L::known,
                "shardwise::forward: the plan entry at a module's path must be PrepareModuleInput, "
                "PrepareModuleOutput or PrepareModuleInputOutput; styles such as ColwiseParallel go on its layers "
                "(a module style of your own: see sw::module_style)");
  auto prepared_input = [&]() -> decltype(auto) {
    if constexpr (!L::input) {
      return (x);
    } else {
      static_assert(detail::input_layout_matches<typename L::in, X>,
                    "shardwise::forward: the module's input does not have its plan entry's input_layouts");
      return detail::move_at_boundary<typename L::mover, typename L::in, typename L::desired_in, Key>(module, x);
    }
  };
  detail::repeated_call const call(detail::meta_trace_of(x));  // on shapes: a repeated block stored once
  auto* const hooks = detail::call_hooks(module, x);
  if (hooks) hooks->before_forward(detail::id_of(module));
  auto&& y = module.forward(prepared_input(), std::forward<Context>(context)...);
  if (hooks) hooks->after_forward(detail::id_of(module));
  if constexpr (!L::output) {
    return y;
  } else {
    using Y = std::remove_cvref_t<decltype(y)>;
    static_assert(detail::input_layout_matches<typename L::out, Y>,
                  "shardwise::forward: the module's output does not have its plan entry's output_layouts");
    return detail::move_at_boundary<typename L::mover, typename L::out, typename L::desired_out, Key>(module, y);
  }
}

/// Calls the module's backward with its plan entry's conjugates applied: the output gradient back to the
/// module's output layout, the input gradient (in the layout the module gives it, or Partial<Sum>) back to the
/// layout the input came in. Without an entry, it is module.backward(dy).
template <module Module, class DY>
constexpr auto backward(Module& module, DY const& dy) {
  using S = detail::module_style_t<Module>;
  using L = detail::prepare_layouts<S>;
  using T = detail::element_of_t<DY>;
  using Key = detail::own_path_key<Module>;
  nn::group<T> const* g = nullptr;
  if constexpr (!is_meta_v<T>) g = (L::input || L::output) ? detail::group_under<T>(module) : nullptr;
  auto output_gradient = [&]() -> decltype(auto) {
    if constexpr (!L::output) {
      return (dy);
    } else {
      static_assert(detail::gradient_layout_ok<typename L::desired_out, typename DY::placement>,
                    "shardwise::backward: the gradient is not in the module's desired_output_layouts");
      using From = typename DY::placement;
      if constexpr (is_meta_v<T>)
        return detail::meta_gradient_moved<typename L::mover, From, typename L::out>(dy);
      else
        return Activation<T, typename L::out>{
            L::mover::template move<From, typename L::out, T>(*g, detail::moved<T>(g, dy, Key::value))};
    }
  };
  detail::repeated_call const call(detail::meta_trace_of(dy));
  auto* const hooks = detail::call_hooks(module, dy);
  if (hooks) hooks->before_backward(detail::id_of(module));
  auto&& dx = module.backward(output_gradient());
  if (hooks) hooks->after_backward(detail::id_of(module));
  if constexpr (!L::input) {
    return dx;
  } else {
    using From = typename std::remove_cvref_t<decltype(dx)>::placement;
    static_assert(detail::gradient_layout_ok<typename L::desired_in, From>,
                  "shardwise::backward: the module's input gradient is neither in its desired_input_layouts nor "
                  "Partial<Sum>");
    if constexpr (is_meta_v<T>)
      return detail::meta_gradient_moved<typename L::mover, From, typename L::in>(dx);
    else
      return Activation<T, typename L::in>{L::mover::template move<From, typename L::in, T>(*g, dx.local)};
  }
}

namespace detail {
template <class Module, class T, class In>
using forward_result_t =
    std::remove_cvref_t<decltype(std::declval<Module&>().forward(std::declval<Activation<T, In> const&>()))>;
template <class Module, class T, class Out>
using backward_result_t =
    std::remove_cvref_t<decltype(std::declval<Module&>().backward(std::declval<Activation<T, Out> const&>()))>;
}  // namespace detail

/// The transfers a module's plan entry adds around sw::forward(module, x) and sw::backward(module, dy) on one
/// rank, in four places: the input moved before the forward (`forward_in`) and the output after it
/// (`forward_out`); the output's gradient moved back before the backward (`backward_out`) and the input's
/// gradient (reduced, when Partial) after it (`backward_in`).
struct call_boundary {
  transfer_list<> forward_in;    ///< Before the module's forward.
  transfer_list<> forward_out;   ///< After it.
  transfer_list<> backward_out;  ///< Before its backward.
  transfer_list<> backward_in;   ///< After it.
};

/// The call_boundary of Module's plan entry for an input of `in_features` and an output of `out_features`
/// columns, T its element type.
template <module Module, class T>
constexpr call_boundary call_boundary_cost(std::size_t in_features, std::size_t out_features, cost_inputs const& s) {
  using L = detail::prepare_layouts<detail::module_style_t<Module>>;
  constexpr std::size_t e = sizeof(T);
  call_boundary b;
  if constexpr (L::input || L::output) {
    using In = std::conditional_t<L::input, typename L::in, Replicate>;
    using DesiredIn = std::conditional_t<L::input, typename L::desired_in, Replicate>;
    using Y = detail::forward_result_t<Module, T, std::conditional_t<L::input, DesiredIn, In>>;
    using InputGradient = typename detail::backward_result_t<Module, T, typename Y::placement>::placement;
    using Mover = typename L::mover;
    if constexpr (L::input) {
      Mover::template add_cost<In, DesiredIn>(b.forward_in, s.tokens, in_features, e, s);
      Mover::template add_cost<InputGradient, In>(b.backward_in, s.tokens, in_features, e, s);
    }
    if constexpr (L::output) {
      using Out = typename L::out;
      using DesiredOut = typename L::desired_out;
      Mover::template add_cost<Out, DesiredOut>(b.forward_out, s.tokens, out_features, e, s);
      Mover::template add_cost<DesiredOut, Out>(b.backward_out, s.tokens, out_features, e, s);
    }
  }
  return b;
}

/// The cost (sw::cost) of sw::forward(module, x) and sw::backward(module, dy) on one rank: the module's own
/// (`inner`, from its shardwise_cost) with its plan entry's moves at the boundary around it (call_boundary_cost).
/// `in_features` / `out_features`: the widths of its input and output; T: its element type.
template <module Module, class T>
constexpr cost call_cost(cost const& inner, std::size_t in_features, std::size_t out_features, cost_inputs const& s) {
  call_boundary const b = call_boundary_cost<Module, T>(in_features, out_features, s);
  cost c;
  c.hold(inner);
  c.forward.append(b.forward_in).append(inner.forward).append(b.forward_out);
  c.backward.append(b.backward_out).append(inner.backward).append(b.backward_in);
  return c;
}

/// x + sw::forward(module, norm(x), context...): the pre-norm residual branch of a transformer block; `context`
/// (a key-value cache and its step, say) goes to the module's forward after its input.
template <class Norm, module Module, class X, class... Context>
constexpr auto residual(Norm& norm, Module& module, X const& x, Context&&... context) {
  return x + forward(module, norm(x), std::forward<Context>(context)...);
}

/// The backward of residual: dy + norm.backward(sw::backward(module, dy)).
template <class Norm, module Module, class DY>
constexpr auto residual_backward(Norm& norm, Module& module, DY const& dy) {
  return dy + norm.backward(backward(module, dy));
}

}  // namespace shardwise

#pragma once
// Activations moved between layouts over the tensor-parallel group: sw::redistribute<To>(tp, x) in user code,
// and the rule PrepareModuleInput/Output and module boundaries apply. Layouts are Replicate, Shard<0> (the
// sequence), Shard<-1> (the features) and, as a source, Partial<Sum> (each rank holds a summand). The steps are
// DTensor's (dtensor/plan.hpp): one set of rules for activations, DTensors and the cost model.
#include <string_view>
#include <type_traits>

#include "shardwise/core/error.hpp"
#include "shardwise/cost/cost.hpp"
#include "shardwise/dtensor/plan.hpp"
#include "shardwise/nn/activation.hpp"
#include "shardwise/nn/group.hpp"
#include "shardwise/placement/chunk.hpp"

namespace shardwise {

namespace detail {

template <class P>
constexpr bool activation_layout() {
  using N = normalize_2d_t<P>;
  return std::is_same_v<N, Replicate> || std::is_same_v<N, Shard<0>> || std::is_same_v<N, Shard<1>>;
}

/// What moves a [tokens, features] activation from layout From to layout To over the tp axis: DTensor's rules
/// (dtensor/plan.hpp) on one mesh axis, so that an activation and a DTensor move alike — Replicate to a Shard takes
/// this rank's piece, a Shard to Replicate all-gathers, Shard<0> to Shard<-1> (and back) is one all-to-all,
/// Partial<Sum> to Replicate all-reduces and to a Shard reduce-scatters. One step at most.
template <class From, class To>
constexpr redistribute_plan<1> activation_steps() {
  static_assert(
      (activation_layout<From>() || std::is_same_v<normalize_2d_t<From>, Partial<Sum>>) && activation_layout<To>(),
      "shardwise::redistribute: activations move from Replicate, Shard<0>, Shard<-1> or Partial<Sum> to "
      "Replicate, Shard<0> or Shard<-1>");
  return plan_redistribute<1>({normalized(placement_value_of<normalize_2d_t<From>>(), 2)},
                              {normalized(placement_value_of<normalize_2d_t<To>>(), 2)});
}

/// One step of a move, run over the group on this rank's [rows, cols] (compiled once per element type).
template <class T>
nn::matrix<T> run_activation_step(nn::group<T> const& g, redistribute_step const& step, nn::matrix<T> const& x) {
  nn::matrix<T> y;
  switch (step.kind) {
    case step_kind::slice: {  // torch.chunk's pieces, as the collectives cut uneven sizes
      int const d = step.to.dim;
      auto const total = static_cast<std::size_t>(d == 0 ? x.rows() : x.cols());
      auto const n = static_cast<std::size_t>(g.size()), r = static_cast<std::size_t>(g.rank());
      auto const first = static_cast<Eigen::Index>(chunk_offset(total, n, r));
      auto const part = static_cast<Eigen::Index>(chunk_size(total, n, r));
      return d == 0 ? nn::matrix<T>(x.middleRows(first, part)) : nn::matrix<T>(x.middleCols(first, part));
    }
    case step_kind::all_gather:
      g.all_gather(x, y, step.from.dim);
      return y;
    case step_kind::all_to_all:
      g.all_to_all(x, y, step.to.dim, step.from.dim);
      return y;
    case step_kind::all_reduce:
      y = x, g.all_reduce(y);
      return y;
    case step_kind::reduce_scatter:
      g.reduce_scatter(x, y, step.to.dim);
      return y;
    case step_kind::keep_one:
    case step_kind::repartial:
      break;  // activation_steps never asks for a Partial output
  }
  fail("shardwise::redistribute: an activation cannot be moved into a Partial layout");
}

/// Moves an activation between layouts over the group. Used backwards too: a gradient in the target layout
/// goes back to the source layout by the same rule (the gradient of a gather is a slice and vice versa).
template <class From, class To, class T>
nn::matrix<T> redistribute_activation(nn::group<T> const& g, nn::matrix<T> const& x) {
  constexpr redistribute_plan<1> plan = activation_steps<From, To>();
  if constexpr (plan.count == 0)
    return x;
  else
    return run_activation_step(g, plan.steps[0], x);
}

/// As above, on an activation the caller gives up: a partial sum is reduced in place instead of in a copy.
template <class From, class To, class T>
nn::matrix<T> redistribute_activation(nn::group<T> const& g, nn::matrix<T>&& x) {
  constexpr redistribute_plan<1> plan = activation_steps<From, To>();
  if constexpr (plan.count == 1 && plan.steps[0].kind == step_kind::all_reduce) {
    g.all_reduce(x);
    return std::move(x);
  } else {
    return redistribute_activation<From, To>(g, static_cast<nn::matrix<T> const&>(x));
  }
}

/// The transfers of one step on a [rows, cols] activation of `element` bytes per value (rows: the whole
/// activation's tokens), as the counting mesh records them: each collective's input on this rank.
constexpr void add_activation_step(transfer_list<>& list, redistribute_step const& step, std::size_t rows,
                                   std::size_t cols, std::size_t element, cost_inputs const& s) {
  auto const held = [&](placement_value p) {  // elements of the activation this rank holds in layout p
    if (p.kind != placement_kind::shard) return rows * cols;
    return p.dim == 0 ? s.local_tokens() * cols : rows * chunk_size(cols, s.tp, s.tp_rank);
  };
  switch (step.kind) {
    case step_kind::all_gather:
      list.add(transfer_kind::all_gather, s.tp_axis, held(step.from) * element);
      break;
    case step_kind::all_to_all:
      list.add(transfer_kind::all_to_all, s.tp_axis, held(step.from) * element);
      break;
    case step_kind::all_reduce:
      list.add(transfer_kind::all_reduce, s.tp_axis, rows * cols * element);
      break;
    case step_kind::reduce_scatter:
      list.add(transfer_kind::reduce_scatter, s.tp_axis, rows * cols * element);
      break;
    case step_kind::slice:
    case step_kind::keep_one:
    case step_kind::repartial:
      break;  // no communication (a Partial output is refused above)
  }
}

/// The transfers of redistribute_activation<From, To> on a [rows, cols] activation of `element` bytes per value,
/// appended to `list`: the same steps, costed. rows: the whole activation's rows (tokens).
template <class From, class To>
constexpr void add_redistribute(transfer_list<>& list, std::size_t rows, std::size_t cols, std::size_t element,
                                cost_inputs const& s) {
  constexpr redistribute_plan<1> plan = activation_steps<From, To>();
  for (std::size_t i = 0; i < plan.count; ++i) add_activation_step(list, plan.steps[i], rows, cols, element, s);
}

template <class Layout, class Given>
inline constexpr bool gradient_layout_ok = same_layout_v<Layout, Given> || std::is_same_v<Given, Partial<Sum>>;

/// A gradient as a layer's backward takes it: in the layer's output layout, or Partial<Sum> — summands several
/// consumers produced and nobody has reduced yet — which is reduced into that layout here, where the layout
/// changes, once. Returns the local matrix (a reference when nothing moves).
template <class Layout, class T, class P>
decltype(auto) gradient_in(nn::group<T> const* group, Activation<T, P> const& dy, char const* layer,
                           std::string_view path) {
  static_assert(gradient_layout_ok<Layout, P>,
                "shardwise::backward: the gradient's layout is neither the layer's output layout nor Partial<Sum>; "
                "pass the gradient of this layer's output (redistribute it with sw::redistribute if it moved)");
  if constexpr (std::is_same_v<P, Partial<Sum>> && !std::is_same_v<normalize_2d_t<Layout>, Partial<Sum>>) {
    if (!group)
      fail("shardwise::", layer, " at \"", path,
           "\": backward got a Partial gradient before parallelize gave the layer its group; call sw::parallelize");
    return nn::matrix<T>(redistribute_activation<Partial<Sum>, Layout>(*group, dy.local));
  } else {
    return (dy.local);
  }
}

}  // namespace detail

/// An activation in another layout over the 1-D tensor-parallel mesh `tp` (collective): Replicate to a Shard
/// takes this rank's piece (no communication), a Shard to Replicate all-gathers, Partial<Sum> to Replicate
/// all-reduces and to Shard<0> reduce-scatters. For the backward of a redistribution, redistribute the
/// gradient with the layouts swapped (the gradient of a gather is a slice, and of a slice a gather).
template <class To, class Mesh, class T, class From>
Activation<T, To> redistribute(Mesh const& tp, Activation<T, From> const& x) {
  auto const group = nn::make_group<T>(tp);
  return {detail::redistribute_activation<From, To>(*group, x.local)};
}

}  // namespace shardwise

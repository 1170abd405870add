#pragma once
// Activations moved between layouts over the tensor-parallel group: sw::redistribute<To>(tp, x) in user code,
// and the rule PrepareModuleInput/Output and module boundaries apply. Layouts are Replicate, Shard<0> (the
// sequence), Shard<-1> (the features) and, as a source, Partial<Sum> (each rank holds a summand). The steps are
// DTensor's (layout/redistribute_plan.hpp), run and costed by DTensor's executor (layout/redistribute_steps.hpp): one
// engine for activations, DTensors and the cost model.
#include <concepts>
#include <cstddef>
#include <string_view>
#include <type_traits>

#include "shardwise/core/error.hpp"
#include "shardwise/cost/cost.hpp"
#include "shardwise/layout/redistribute_plan.hpp"
#include "shardwise/layout/redistribute_steps.hpp"
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
/// (layout/redistribute_plan.hpp) on one mesh axis, so that an activation and a DTensor move alike — Replicate to a
/// Shard takes this rank's piece, a Shard to Replicate all-gathers, Shard<0> to Shard<-1> (and back) is one all-to-all,
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

/// A layer's tp group as a step of a move runs over it (layout/redistribute_steps.hpp): activations move by the
/// executor DTensors move by. An activation is only ever Partial as a sum.
template <class T>
struct group_axis {
  nn::group<T> const& group;

  [[nodiscard]] int size() const { return group.size(); }
  [[nodiscard]] int rank() const { return group.rank(); }
  void all_gather(nn::matrix<T> const& in, nn::matrix<T>& out, int dim) const { group.all_gather(in, out, dim); }
  void all_to_all(nn::matrix<T> const& in, nn::matrix<T>& out, int split_dim, int concat_dim) const {
    group.all_to_all(in, out, split_dim, concat_dim);
  }
  void all_reduce(nn::matrix<T>& x, op_kind op) const { group.all_reduce(x, op); }
  void reduce_scatter(nn::matrix<T> const& in, nn::matrix<T>& out, int dim, op_kind) const {
    group.reduce_scatter(in, out, dim);
  }
};

/// Moves an activation between layouts over the group. Used backwards too: a gradient in the target layout
/// goes back to the source layout by the same rule (the gradient of a gather is a slice and vice versa).
template <class From, class To, class T>
nn::matrix<T> redistribute_activation(nn::group<T> const& g, nn::matrix<T> const& x) {
  constexpr redistribute_plan<1> plan = activation_steps<From, To>();
  if constexpr (plan.count == 0)
    return x;
  else
    return step_result(plan.steps[0], group_axis<T>{g}, x);
}

/// As above, on an activation the caller gives up: a partial sum is reduced in place instead of in a copy.
template <class From, class To, class T>
nn::matrix<T> redistribute_activation(nn::group<T> const& g, nn::matrix<T>&& x) {
  constexpr redistribute_plan<1> plan = activation_steps<From, To>();
  if constexpr (plan.count == 1) run_redistribute_step(plan.steps[0], group_axis<T>{g}, x);
  return std::move(x);
}

/// The transfers of redistribute_activation<From, To> on a [rows, cols] activation of `element` bytes per value,
/// appended to `list`: the same steps, costed as a DTensor's move is (rows: the whole activation's tokens).
template <class From, class To>
constexpr void add_redistribute(transfer_list<>& list, std::size_t rows, std::size_t cols, std::size_t element,
                                cost_inputs const& s) {
  constexpr redistribute_plan<1> plan = activation_steps<From, To>();
  add_redistribute_transfers(list, plan, {normalized(placement_value_of<normalize_2d_t<From>>(), 2)},
                             extents{rows, cols}, element, {s.tp}, {s.tp_rank}, {s.tp_axis});
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

/// The library's one way of moving activations between layouts over the tp group (sw::redistribute's), as a
/// style's mover: `move` runs a move, `add_cost` appends the transfers that move runs to a cost list.
struct layout_engine {
  /// `x` ([tokens, features] on this rank, in layout From) in layout To.
  template <class From, class To, class T>
  static nn::matrix<T> move(nn::group<T> const& group, nn::matrix<T> const& x) {
    return detail::redistribute_activation<From, To>(group, x);
  }
  /// As above, on an activation the caller gives up (a partial sum is reduced in place).
  template <class From, class To, class T>
  static nn::matrix<T> move(nn::group<T> const& group, nn::matrix<T>&& x) {
    return detail::redistribute_activation<From, To>(group, std::move(x));
  }
  /// The transfers of move<From, To> on a whole activation of [rows, cols] values of `element` bytes.
  template <class From, class To>
  static constexpr void add_cost(transfer_list<>& list, std::size_t rows, std::size_t cols, std::size_t element,
                                 cost_inputs const& s) {
    detail::add_redistribute<From, To>(list, rows, cols, element, s);
  }
};

/// A mover: moves an activation of element type T between two layouts over the group, and states what the move
/// transfers (the cost model and the counting mesh's record must agree, entry for entry).
template <class M, class T>
concept activation_mover =
    requires(nn::group<T> const& group, nn::matrix<T> const& x, transfer_list<>& list, cost_inputs const& s) {
      { M::template move<Replicate, Shard<1>, T>(group, x) } -> std::same_as<nn::matrix<T>>;
      M::template add_cost<Replicate, Shard<1>>(list, std::size_t{}, std::size_t{}, std::size_t{}, s);
    };

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

#pragma once
// Activations moved between layouts over the tensor-parallel group: sw::redistribute<To>(tp, x) in user code,
// and the rule PrepareModuleInput/Output and module boundaries apply. Layouts are Replicate, Shard<0> (the
// sequence), Shard<-1> (the features) and, as a source, Partial<Sum> (each rank holds a summand).
#include <type_traits>

#include "shardwise/core/error.hpp"
#include "shardwise/nn/activation.hpp"
#include "shardwise/nn/group.hpp"

namespace shardwise {

namespace detail {

template <class P>
constexpr bool activation_layout() {
  using N = normalize_2d_t<P>;
  return std::is_same_v<N, Replicate> || std::is_same_v<N, Shard<0>> || std::is_same_v<N, Shard<1>>;
}

/// Moves an activation between layouts over the group. Used backwards too: a gradient in the target layout
/// goes back to the source layout by the same rule (the gradient of a gather is a slice and vice versa).
template <class From, class To, class T>
nn::matrix<T> redistribute_activation(nn::group<T> const& g, nn::matrix<T> const& x) {
  using F = normalize_2d_t<From>;
  using G = normalize_2d_t<To>;
  static_assert((activation_layout<F>() || std::is_same_v<F, Partial<Sum>>)&&activation_layout<G>(),
                "shardwise::redistribute: activations move from Replicate, Shard<0>, Shard<-1> or Partial<Sum> to "
                "Replicate, Shard<0> or Shard<-1>");
  if constexpr (std::is_same_v<F, G>) {
    return x;
  } else if constexpr (std::is_same_v<F, Partial<Sum>>) {  // the summands added: all-reduce or reduce-scatter
    nn::matrix<T> y = x;
    if constexpr (std::is_same_v<G, Replicate>) {
      g.all_reduce(y);
    } else {
      g.reduce_scatter(x, y, G::dim);
    }
    return y;
  } else if constexpr (std::is_same_v<F, Replicate>) {  // take this rank's piece: no communication
    constexpr int d = G::dim;
    auto const n = g.size(), r = g.rank();
    auto const total = d == 0 ? x.rows() : x.cols();
    if (total % n != 0)
      fail("shardwise::redistribute: ", total, d == 0 ? " tokens" : " features", " do not divide over ", n,
           " ranks of mesh axis \"", g.axis(), "\"; choose sizes the tp size divides");
    auto const part = total / n;
    return d == 0 ? nn::matrix<T>(x.middleRows(r * part, part)) : nn::matrix<T>(x.middleCols(r * part, part));
  } else if constexpr (std::is_same_v<G, Replicate>) {
    nn::matrix<T> all;
    g.all_gather(x, all, F::dim);
    return all;
  } else {
    return redistribute_activation<Replicate, To>(g, redistribute_activation<From, Replicate>(g, x));
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

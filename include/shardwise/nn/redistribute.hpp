#pragma once
// Activations moved between layouts over the tensor-parallel group: sw::redistribute<To>(tp, x) in user code,
// and the rule PrepareModuleInput/Output and module boundaries apply. Layouts are Replicate, Shard<0> (the
// sequence), Shard<-1> (the features) and, as a source, Partial<Sum> (each rank holds a summand).
#include <string_view>
#include <type_traits>

#include "shardwise/core/error.hpp"
#include "shardwise/cost/cost.hpp"
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

/// Moves an activation between layouts over the group. Used backwards too: a gradient in the target layout
/// goes back to the source layout by the same rule (the gradient of a gather is a slice and vice versa).
template <class From, class To, class T>
nn::matrix<T> redistribute_activation(nn::group<T> const& g, nn::matrix<T> const& x) {
  using F = normalize_2d_t<From>;
  using G = normalize_2d_t<To>;
  static_assert((activation_layout<F>() || std::is_same_v<F, Partial<Sum>>) && activation_layout<G>(),
                "shardwise::redistribute: activations move from Replicate, Shard<0>, Shard<-1> or Partial<Sum> to "
                "Replicate, Shard<0> or Shard<-1>");
  if constexpr (std::is_same_v<F, G>) {
    return x;
  } else if constexpr (std::is_same_v<F, Partial<Sum>>) {  // the summands added: all-reduce or reduce-scatter
    nn::matrix<T> y;
    if constexpr (std::is_same_v<G, Replicate>) {
      y = x;
      g.all_reduce(y);
    } else {
      g.reduce_scatter(x, y, G::dim);
    }
    return y;
  } else if constexpr (std::is_same_v<F, Replicate>) {  // take this rank's piece: no communication
    constexpr int d = G::dim;
    // torch.chunk's pieces, as the collectives cut uneven sizes: ceil(total / n) each, the last ranks the rest.
    auto const total = static_cast<std::size_t>(d == 0 ? x.rows() : x.cols());
    auto const n = static_cast<std::size_t>(g.size()), r = static_cast<std::size_t>(g.rank());
    auto const first = static_cast<Eigen::Index>(chunk_offset(total, n, r));
    auto const part = static_cast<Eigen::Index>(chunk_size(total, n, r));
    return d == 0 ? nn::matrix<T>(x.middleRows(first, part)) : nn::matrix<T>(x.middleCols(first, part));
  } else if constexpr (std::is_same_v<G, Replicate>) {
    nn::matrix<T> all;
    g.all_gather(x, all, F::dim);
    return all;
  } else {
    return redistribute_activation<Replicate, To>(g, redistribute_activation<From, Replicate>(g, x));
  }
}

/// As above, on an activation the caller gives up: a partial sum is reduced in place instead of in a copy.
template <class From, class To, class T>
nn::matrix<T> redistribute_activation(nn::group<T> const& g, nn::matrix<T>&& x) {
  if constexpr (std::is_same_v<normalize_2d_t<From>, Partial<Sum>> && std::is_same_v<normalize_2d_t<To>, Replicate>) {
    g.all_reduce(x);
    return std::move(x);
  } else {
    return redistribute_activation<From, To>(g, static_cast<nn::matrix<T> const&>(x));
  }
}

/// The transfers of redistribute_activation<From, To> on a [rows, cols] activation of
/// `element` bytes per value, appended to `list`. rows: the whole activation's rows (tokens).
template <class From, class To>
constexpr void add_redistribute(transfer_list<>& list, std::size_t rows, std::size_t cols, std::size_t element,
                                cost_inputs const& s) {
  using F = normalize_2d_t<From>;
  using G = normalize_2d_t<To>;
  if constexpr (std::is_same_v<F, G>) {
    return;
  } else if constexpr (std::is_same_v<F, Partial<Sum>>) {
    list.add(std::is_same_v<G, Replicate> ? transfer_kind::all_reduce : transfer_kind::reduce_scatter, s.tp_axis,
             rows * cols * element);
  } else if constexpr (std::is_same_v<F, Replicate>) {
    return;  // this rank's piece is taken: nothing moves
  } else if constexpr (std::is_same_v<G, Replicate>) {
    std::size_t const piece = F::dim == 0 ? s.local_tokens() * cols : rows * chunk_size(cols, s.tp, s.tp_rank);
    list.add(transfer_kind::all_gather, s.tp_axis, piece * element);
  } else {
    add_redistribute<From, Replicate>(list, rows, cols, element, s);
  }
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

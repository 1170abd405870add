#pragma once
// The one redistribution engine's executor and its cost. plan_redistribute (layout/redistribute_plan.hpp) decides the
// steps; run_redistribute_step runs one on this rank's piece over a mesh axis — a DTensor's axis communicator, or a
// layer's tp group (nn/redistribute.hpp) — and add_redistribute_transfers states what the same steps move, as a
// counting mesh records it. DTensors, activations and the cost model all go through these two functions.
#include <array>
#include <cstddef>
#include <string_view>
#include <utility>

#include "shardwise/core/error.hpp"
#include "shardwise/cost/transfer.hpp"
#include "shardwise/layout/redistribute_plan.hpp"
#include "shardwise/mesh/collectives.hpp"
#include "shardwise/placement/chunk.hpp"
#include "shardwise/placement/placement.hpp"
#include "shardwise/tensor/box.hpp"
#include "shardwise/tensor/concept.hpp"

namespace shardwise::detail {

template <std::size_t K>
using placements = std::array<placement_value, K>;

/// A piece of the global tensor: where it starts and its size.
struct box {
  extents offset, size;
};

/// The part of the global tensor this rank holds: cuts applied axis by axis, in mesh order.
template <std::size_t K>
box local_box(extents const& global, placements<K> const& layout, std::array<int, K> const& sizes,
              std::array<int, K> const& coords) {
  box b{zero_offset(global.rank), global};
  for (std::size_t i = 0; i < K; ++i) {
    if (layout[i].kind != placement_kind::shard) continue;
    auto const d = static_cast<std::size_t>(layout[i].dim);
    auto const n = static_cast<std::size_t>(sizes[i]), c = static_cast<std::size_t>(coords[i]);
    b.offset[d] += chunk_offset(b.size[d], n, c);
    b.size[d] = chunk_size(b.size[d], n, c);
  }
  return b;
}

/// A Partial<Sum> placement keeps the value on coordinate 0 only; the other ranks hold zeros.
template <std::size_t K>
bool holds_zeros(placements<K> const& layout, std::array<int, K> const& coords) {
  for (std::size_t i = 0; i < K; ++i)
    if (layout[i].kind == placement_kind::partial && layout[i].op == op_kind::sum && coords[i] != 0) return true;
  return false;
}

template <class Tensor>
Tensor copy_of_box(Tensor const& from, box const& b) {
  Tensor to = make_tensor<Tensor>(b.size);
  copy_box(traits_of<Tensor>::data(from), shape_of(from), b.offset, data_of(to), b.size, zero_offset(b.size.rank),
           b.size, traits_of<Tensor>::order);
  return to;
}

template <class Tensor>
void fill_zero(Tensor& t) {
  std::size_t const n = shape_of(t).elements();
  auto* p = data_of(t);
  for (std::size_t i = 0; i < n; ++i) p[i] = element_t<Tensor>(0);
}

/// A shape of the same rank with no elements: an output the collective will size.
template <class Tensor>
extents empty_like(Tensor const& t) {
  extents e = shape_of(t);
  if (e.rank) e[0] = 0;
  return e;
}

/// A DTensor's mesh axis as a step runs over it: the axis' communicator and this rank's coordinate on it.
template <class Comm>
struct comm_axis {
  Comm const& comm;
  int coordinate;

  [[nodiscard]] int size() const { return comm.size(); }
  [[nodiscard]] int rank() const { return coordinate; }
  template <class Tensor>
  void all_gather(Tensor const& in, Tensor& out, int dim) const {
    all_gather_on(comm, in, out, dim);
  }
  template <class Tensor>
  void all_to_all(Tensor const& in, Tensor& out, int split_dim, int concat_dim) const {
    all_to_all_on(comm, in, out, split_dim, concat_dim);
  }
  template <class Tensor>
  void all_reduce(Tensor& t, op_kind op) const {
    all_reduce_on(comm, t, op);
  }
  template <class Tensor>
  void reduce_scatter(Tensor const& in, Tensor& out, int dim, op_kind op) const {
    reduce_scatter_on(comm, in, out, dim, op);
  }
};

template <class Comm>
comm_axis(Comm const&, int) -> comm_axis<Comm>;  // (clang before 17 deduces no aggregate's arguments)

/// What a step runs over: its size, this rank's place on it, and the four collectives a move is made of.
template <class Axis, class Tensor>
concept step_axis = requires(Axis const& a, Tensor const& in, Tensor& out, int dim, op_kind op) {
  { a.size() } -> std::convertible_to<int>;
  { a.rank() } -> std::convertible_to<int>;
  a.all_gather(in, out, dim);
  a.all_to_all(in, out, dim, dim);
  a.all_reduce(out, op);
  a.reduce_scatter(in, out, dim, op);
};

/// Runs a step that reduces (or keeps) this rank's piece `local` over `axis`, in place.
template <class Tensor, step_axis<Tensor> Axis>
void reduce_in_place(redistribute_step const& step, Axis const& axis, Tensor& local) {
  if (step.kind != step_kind::keep_one) axis.all_reduce(local, step.from.op);  // all_reduce, repartial
  if (step.kind != step_kind::all_reduce && step.to.op == op_kind::sum && axis.rank() != 0) fill_zero(local);
}

/// This rank's piece after one step of a move over `axis`, from its piece `local` before it.
template <class Tensor, step_axis<Tensor> Axis>
Tensor step_result(redistribute_step const& step, Axis const& axis, Tensor const& local) {
  Tensor out = make_tensor<Tensor>(empty_like(local));  // sized by the collective
  switch (step.kind) {
    case step_kind::slice: {  // torch.chunk's pieces, as the collectives cut uneven sizes
      auto const d = static_cast<std::size_t>(step.to.dim);
      extents const shape = shape_of(local);
      auto const n = static_cast<std::size_t>(axis.size()), c = static_cast<std::size_t>(axis.rank());
      return copy_of_box(local, box{with_dim(zero_offset(shape.rank), d, chunk_offset(shape[d], n, c)),
                                    with_dim(shape, d, chunk_size(shape[d], n, c))});
    }
    case step_kind::all_gather:
      axis.all_gather(local, out, step.from.dim);
      return out;
    case step_kind::all_to_all:
      axis.all_to_all(local, out, step.to.dim, step.from.dim);
      return out;
    case step_kind::reduce_scatter:
      axis.reduce_scatter(local, out, step.to.dim, step.from.op);
      return out;
    case step_kind::all_reduce:
    case step_kind::repartial:
    case step_kind::keep_one:
      break;
  }
  out = local;
  reduce_in_place(step, axis, out);
  return out;
}

/// Runs one step of a move on this rank's piece `local` over `axis`, in place where the step reduces.
template <class Tensor, step_axis<Tensor> Axis>
void run_redistribute_step(redistribute_step const& step, Axis const& axis, Tensor& local) {
  bool const reduces =
      step.kind == step_kind::all_reduce || step.kind == step_kind::repartial || step.kind == step_kind::keep_one;
  if (reduces)
    reduce_in_place(step, axis, local);
  else
    local = step_result(step, axis, local);
}

/// Elements of this rank's piece of a `global` tensor in `layout` (normalized) on a mesh of `sizes`.
template <std::size_t K>
constexpr std::size_t local_elements(extents global, placements<K> const& layout,
                                     std::array<std::size_t, K> const& sizes,
                                     std::array<std::size_t, K> const& coords) {
  for (std::size_t i = 0; i < K; ++i)
    if (layout[i].kind == placement_kind::shard) {
      auto const d = static_cast<std::size_t>(layout[i].dim);
      global[d] = chunk_size(global[d], sizes[i], coords[i]);
    }
  return global.elements();
}

/// Appends what `plan` (a move of a `global` tensor from layout `from`, normalized) transfers on this rank, as
/// a counting mesh records it: for each step with communication, its kind on its axis with this rank's input.
template <std::size_t K, std::size_t Capacity>
constexpr void add_redistribute_transfers(transfer_list<Capacity>& list, redistribute_plan<K> const& plan,
                                          placements<K> from, extents const& global, std::size_t element,
                                          std::array<std::size_t, K> const& sizes,
                                          std::array<std::size_t, K> const& coords,
                                          std::array<std::string_view, K> const& axes) {
  for (std::size_t i = 0; i < plan.count; ++i) {
    redistribute_step const& step = plan.steps[i];
    std::size_t const bytes = local_elements(global, from, sizes, coords) * element;
    switch (step.kind) {
      case step_kind::all_gather:
        list.add(transfer_kind::all_gather, axes[step.axis], bytes);
        break;
      case step_kind::all_to_all:
        list.add(transfer_kind::all_to_all, axes[step.axis], bytes);
        break;
      case step_kind::all_reduce:
      case step_kind::repartial:
        list.add(transfer_kind::all_reduce, axes[step.axis], bytes);
        break;
      case step_kind::reduce_scatter:
        list.add(transfer_kind::reduce_scatter, axes[step.axis], bytes);
        break;
      case step_kind::slice:
      case step_kind::keep_one:
        break;  // this rank's own values: no communication
    }
    from[step.axis] = step.to;
  }
}

}  // namespace shardwise::detail

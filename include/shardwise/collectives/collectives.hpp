#pragma once
// Collectives on tensors along any dimension, over a 1-D mesh (mesh.axis<"tp">()). On shared-memory
// backends every rank reads its peers' buffers directly (one copy per byte); on MPI contiguous cases go
// straight to MPI and strided ones are packed once. Shapes are checked on every rank before data moves, so
// a mismatch raises the same error everywhere instead of corrupting memory or hanging.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardwise/collectives/detail.hpp"
#include "shardwise/core/reduce.hpp"
#include "shardwise/mesh/mesh.hpp"
#include "shardwise/mesh/thread.hpp"
#include "shardwise/placement/chunk.hpp"
#include "shardwise/placement/placement.hpp"
#include "shardwise/tensor/box.hpp"
#include "shardwise/tensor/concept.hpp"

namespace shardwise {

namespace detail {

/// acc[i] = reduction over ranks, in rank order, of source(q)[i] for i < n; identical on every backend and
/// rank. The first two sources are combined directly, so nothing is staged (the copy showed in profiles).
template <op_kind Op, class E, class Source>
void reduce_block_rank_order(E* __restrict acc, int ranks, Source&& source, std::size_t n) {
  E const* const first = source(0);
  if (ranks == 1) {
    std::memcpy(acc, first, n * sizeof(E));
  } else {
    E const* const second = source(1);
    for (std::size_t i = 0; i < n; ++i) acc[i] = combine<Op>(first[i], second[i]);
  }
  for (int q = 2; q < ranks; ++q) {
    E const* from = source(q);
    for (std::size_t i = 0; i < n; ++i) acc[i] = combine<Op>(acc[i], from[i]);
  }
  if constexpr (Op == op_kind::avg) divide_by_ranks(acc, n, ranks);
}

/// dst[i] = reduction over ranks, in rank order, of source(q)[i]; identical on every backend and rank.
template <op_kind Op, class E, class Source>
void reduce_rank_order(E* dst, int ranks, Source&& source, std::size_t count) {
  constexpr std::size_t block = 1024;
  E acc[block];
  for (std::size_t start = 0; start < count; start += block) {
    std::size_t const n = std::min(block, count - start);
    reduce_block_rank_order<Op>(acc, ranks, [&](int q) { return source(q) + start; }, n);
    std::memcpy(dst + start, acc, n * sizeof(E));
  }
}

template <class E>
E const* slot_input(thread_slot const& slot) {
  return static_cast<E const*>(slot.in);
}

template <class Comm, tensor T>
void all_reduce_on(Comm const& comm, T& t, op_kind op) {
  using E = element_t<T>;
  auto const site = site_of(comm, "all_reduce");
  extents const shape = shape_of(t);
  E* const data = data_of(t);
  std::size_t const n = shape.elements();
  int const ranks = comm.size();
  if constexpr (Comm::shared_memory) {
    comm.exchange(make_slot(data, data, shape), "all_reduce", [&](std::vector<thread_slot> const& slots) {
      check_shapes_agree(ranks, [&](int q) { return slots[static_cast<std::size_t>(q)].shape; }, max_rank, site);
      if (ranks == 1) return;
      // One pass: rank `me` reduces piece `me` of every buffer, in rank order, and writes the result into that
      // piece of every buffer. Only rank `me` touches piece `me` anywhere, so the exchange's two barriers
      // suffice, and each byte crosses between cores once (two passes with a copy-back measured 2-3x slower).
      auto const me = static_cast<std::size_t>(comm.rank());
      std::size_t const start = chunk_offset(n, slots.size(), me), count = chunk_size(n, slots.size(), me);
      dispatch_op(op, [&]<op_kind Op>() {
        if (ranks == 2) {  // one fused loop, stored straight into both buffers: ~2x faster than via a block
          E const* const in0 = slot_input<E>(slots[0]) + start;
          E const* const in1 = slot_input<E>(slots[1]) + start;
          E* const out0 = static_cast<E*>(slots[0].out) + start;
          E* const out1 = static_cast<E*>(slots[1].out) + start;
          E const two = static_cast<E>(2);
          for (std::size_t i = 0; i < count; ++i) {
            E x = combine<Op>(in0[i], in1[i]);
            if constexpr (Op == op_kind::avg) x = static_cast<E>(x / two);
            out0[i] = x;
            out1[i] = x;
          }
          return;
        }
        constexpr std::size_t block = 1024;
        E acc[block];
        for (std::size_t b = 0; b < count; b += block) {
          std::size_t const m = std::min(block, count - b);
          reduce_block_rank_order<Op>(
              acc, ranks, [&](int q) { return slot_input<E>(slots[static_cast<std::size_t>(q)]) + start + b; }, m);
          for (auto const& slot : slots) copy_elements(static_cast<E*>(slot.out) + start + b, acc, m);
        }
      });
    });
  } else {
    auto const shapes = comm.all_gather_value(shape);
    check_shapes_agree(ranks, [&](int q) { return shapes[static_cast<std::size_t>(q)]; }, max_rank, site);
    if (ranks == 1) return;
    comm.all_reduce(data, n, op);
    if (op == op_kind::avg) divide_by_ranks(data, n, ranks);
  }
}

template <class Comm, tensor In, tensor Out>
void all_gather_on(Comm const& comm, In const& in, Out& out, int dim) {
  check_same_element<In, Out>();
  using E = element_t<In>;
  constexpr storage_order order = traits_of<In>::order;
  auto const site = site_of(comm, "all_gather");
  check_not_aliased(in, out, site);
  extents const shape = shape_of(in);
  std::size_t const d = normalize_dim(dim, shape.rank, site);
  E const* const data = traits_of<In>::data(in);
  int const ranks = comm.size();
  auto gathered_shape = [&](auto&& shape_of_rank) {
    check_shapes_agree(ranks, shape_of_rank, d, site);
    std::size_t total = 0;
    for (int q = 0; q < ranks; ++q) total += shape_of_rank(q)[d];
    return with_dim(shape, d, total);
  };
  if constexpr (Comm::shared_memory) {
    comm.exchange(make_slot(data, nullptr, shape), "all_gather", [&](std::vector<thread_slot> const& slots) {
      auto slot_shape = [&](int q) { return slots[static_cast<std::size_t>(q)].shape; };
      extents const result = gathered_shape(slot_shape);
      prepare_output(out, result, site);
      extents offset = zero_offset(shape.rank);
      for (auto const& slot : slots) {
        copy_box(slot_input<E>(slot), slot.shape, zero_offset(shape.rank), data_of(out), result, offset, slot.shape,
                 order);
        offset[d] += slot.shape[d];
      }
    });
  } else {
    // Each rank's size along d and a fingerprint of the rest of its shape (16 bytes, not the whole shape). Only
    // when the fingerprints disagree are the whole shapes exchanged, to name them in the error every rank raises.
    struct gather_key {
      std::uint64_t along, rest;
    };
    gather_key const mine{shape[d], shape_fingerprint(shape, d)};
    if constexpr (requires { comm.pair_exchange(mine, data, std::size_t{}, [](gather_key const&) {}); }) {
      if (ranks == 2 && rows_outside(shape, d, order) == 1) {  // the key beside the data: no round trip of its own
        int const me = comm.rank();
        std::size_t peer_count = 0;
        bool agreed = false;
        comm.pair_exchange(mine, data, shape.elements(), [&](gather_key const& theirs) -> std::pair<E*, std::size_t> {
          if (theirs.rest != mine.rest) return {nullptr, 0};
          extents const peer = with_dim(shape, d, static_cast<std::size_t>(theirs.along));
          extents const result = gathered_shape([&](int q) { return q == me ? shape : peer; });
          prepare_output(out, result, site);
          agreed = true;
          peer_count = peer.elements();
          return {data_of(out) + (me == 0 ? shape.elements() : 0), peer_count};
        });
        if (agreed) {
          E* const own = data_of(out) + (me == 0 ? 0 : peer_count);
          if (shape.elements() != 0) std::memcpy(own, data, shape.elements() * sizeof(E));
          return;
        }
        auto const shapes = comm.all_gather_value(shape);  // to name both shapes in the error
        gathered_shape([&](int q) { return shapes[static_cast<std::size_t>(q)]; });
        fail(site, ": shapes differ across ranks");  // unreachable: the fingerprints differ, so the shapes do
      }
    }
    auto const keys = comm.all_gather_value(mine);
    std::vector<extents> shapes(keys.size(), shape);
    for (std::size_t q = 0; q < keys.size(); ++q) {
      if (keys[q].rest != keys[0].rest) {
        shapes = comm.all_gather_value(shape);
        break;
      }
      shapes[q][d] = static_cast<std::size_t>(keys[q].along);
    }
    auto shape_at = [&](int q) { return shapes[static_cast<std::size_t>(q)]; };
    extents const result = gathered_shape(shape_at);
    prepare_output(out, result, site);
    std::vector<std::size_t> counts(shapes.size());
    for (std::size_t q = 0; q < shapes.size(); ++q) counts[q] = shapes[q].elements();
    if (rows_outside(shape, d, order) == 1) {  // pieces are contiguous in the output: gather in place
      comm.all_gatherv(data, data_of(out), counts);
      return;
    }
    std::vector<E> packed(result.elements());
    comm.all_gatherv(data, packed.data(), counts);
    extents offset = zero_offset(shape.rank);
    std::size_t position = 0;
    for (std::size_t q = 0; q < shapes.size(); ++q) {
      copy_box(packed.data() + position, shapes[q], zero_offset(shape.rank), data_of(out), result, offset, shapes[q],
               order);
      offset[d] += shapes[q][d];
      position += counts[q];
    }
  }
}

template <class Comm, tensor In, tensor Out>
void reduce_scatter_on(Comm const& comm, In const& in, Out& out, int dim, op_kind op) {
  check_same_element<In, Out>();
  using E = element_t<In>;
  constexpr storage_order order = traits_of<In>::order;
  auto const site = site_of(comm, "reduce_scatter");
  check_not_aliased(in, out, site);
  extents const shape = shape_of(in);
  std::size_t const d = normalize_dim(dim, shape.rank, site);
  E const* const data = traits_of<In>::data(in);
  int const ranks = comm.size();
  auto const pieces = static_cast<std::size_t>(ranks);
  auto const me = static_cast<std::size_t>(comm.rank());
  extents const mine = with_dim(shape, d, chunk_size(shape[d], pieces, me));
  extents const my_offset = with_dim(zero_offset(shape.rank), d, chunk_offset(shape[d], pieces, me));
  if constexpr (Comm::shared_memory) {
    comm.exchange(make_slot(data, nullptr, shape), "reduce_scatter", [&](std::vector<thread_slot> const& slots) {
      check_shapes_agree(ranks, [&](int q) { return slots[static_cast<std::size_t>(q)].shape; }, max_rank, site);
      prepare_output(out, mine, site);
      E* const result = data_of(out);
      dispatch_op(op, [&]<op_kind Op>() {
        for_each_run(mine, zero_offset(shape.rank), shape, my_offset, mine, order,
                     [&](std::size_t to, std::size_t from, std::size_t n) {
                       reduce_rank_order<Op>(
                           result + to, ranks,
                           [&](int q) { return slot_input<E>(slots[static_cast<std::size_t>(q)]) + from; }, n);
                     });
      });
    });
  } else {
    auto const shapes = comm.all_gather_value(shape);
    check_shapes_agree(ranks, [&](int q) { return shapes[static_cast<std::size_t>(q)]; }, max_rank, site);
    prepare_output(out, mine, site);
    std::vector<std::size_t> counts(pieces);
    for (std::size_t q = 0; q < pieces; ++q) counts[q] = with_dim(shape, d, chunk_size(shape[d], pieces, q)).elements();
    if (ranks == 1) {
      copy_elements(data_of(out), data, shape.elements());
    } else if (rows_outside(shape, d, order) == 1) {  // each rank's piece is contiguous in the input
      comm.reduce_scatterv(data, data_of(out), counts, op);
    } else {
      std::vector<E> packed(shape.elements());
      std::size_t position = 0;
      for (std::size_t q = 0; q < pieces; ++q) {
        extents const piece = with_dim(shape, d, chunk_size(shape[d], pieces, q));
        copy_box(data, shape, with_dim(zero_offset(shape.rank), d, chunk_offset(shape[d], pieces, q)),
                 packed.data() + position, piece, zero_offset(shape.rank), piece, order);
        position += counts[q];
      }
      comm.reduce_scatterv(packed.data(), data_of(out), counts, op);
    }
    if (op == op_kind::avg && ranks > 1) divide_by_ranks(data_of(out), mine.elements(), ranks);
  }
}

template <class Comm, tensor T>
void broadcast_on(Comm const& comm, T& t, int root) {
  using E = element_t<T>;
  auto const site = site_of(comm, "broadcast");
  int const ranks = comm.size();
  if (root < 0 || root >= ranks)
    fail(site, ": root rank ", root, " does not exist; the axis has ranks 0 to ", ranks - 1);
  bool const is_root = comm.rank() == root;
  if constexpr (Comm::shared_memory) {
    comm.exchange(make_slot(data_of(t), nullptr, shape_of(t)), "broadcast", [&](std::vector<thread_slot> const& slots) {
      if (is_root) return;
      auto const& from = slots[static_cast<std::size_t>(root)];
      prepare_output(t, from.shape, site);
      copy_elements(data_of(t), static_cast<E const*>(from.in), from.shape.elements());
    });
  } else {
    extents shape = shape_of(t);
    comm.broadcast(reinterpret_cast<unsigned char*>(&shape), sizeof(extents), root);
    if (!is_root) prepare_output(t, shape, site);
    comm.broadcast(data_of(t), shape.elements(), root);
  }
}

template <class Comm, tensor In, tensor Out>
void all_to_all_on(Comm const& comm, In const& in, Out& out, int split_dim, int concat_dim) {
  check_same_element<In, Out>();
  using E = element_t<In>;
  constexpr storage_order order = traits_of<In>::order;
  auto const site = site_of(comm, "all_to_all");
  check_not_aliased(in, out, site);
  extents const shape = shape_of(in);
  std::size_t const sd = normalize_dim(split_dim, shape.rank, site);
  std::size_t const cd = normalize_dim(concat_dim, shape.rank, site);
  E const* const data = traits_of<In>::data(in);
  int const ranks = comm.size();
  auto const pieces = static_cast<std::size_t>(ranks);
  auto const me = static_cast<std::size_t>(comm.rank());
  // The piece rank `from` (input shape s) sends to rank `to`: its chunk `to` along the split dimension.
  auto piece = [&](extents const& s, std::size_t to) { return with_dim(s, sd, chunk_size(s[sd], pieces, to)); };
  auto piece_offset = [&](extents const& s, std::size_t to) {
    return with_dim(zero_offset(s.rank), sd, chunk_offset(s[sd], pieces, to));
  };
  auto result_shape = [&](auto&& shape_of_rank) {
    check_shapes_agree(ranks, shape_of_rank, cd, site);
    extents result = piece(shape, me);
    std::size_t total = 0;
    for (int q = 0; q < ranks; ++q) total += piece(shape_of_rank(q), me)[cd];
    result[cd] = total;
    return result;
  };
  if constexpr (Comm::shared_memory) {
    comm.exchange(make_slot(data, nullptr, shape), "all_to_all", [&](std::vector<thread_slot> const& slots) {
      extents const result = result_shape([&](int q) { return slots[static_cast<std::size_t>(q)].shape; });
      prepare_output(out, result, site);
      extents offset = zero_offset(shape.rank);
      for (auto const& slot : slots) {
        extents const block = piece(slot.shape, me);
        copy_box(slot_input<E>(slot), slot.shape, piece_offset(slot.shape, me), data_of(out), result, offset, block,
                 order);
        offset[cd] += block[cd];
      }
    });
  } else {
    auto const shapes = comm.all_gather_value(shape);
    extents const result = result_shape([&](int q) { return shapes[static_cast<std::size_t>(q)]; });
    prepare_output(out, result, site);
    std::vector<std::size_t> send_counts(pieces), recv_counts(pieces);
    for (std::size_t q = 0; q < pieces; ++q) {
      send_counts[q] = piece(shape, q).elements();
      recv_counts[q] = piece(shapes[q], me).elements();
    }
    std::vector<E> send(shape.elements()), received(result.elements());
    std::size_t position = 0;
    for (std::size_t q = 0; q < pieces; ++q) {
      copy_box(data, shape, piece_offset(shape, q), send.data() + position, piece(shape, q), zero_offset(shape.rank),
               piece(shape, q), order);
      position += send_counts[q];
    }
    comm.all_to_allv(send.data(), send_counts, received.data(), recv_counts);
    extents offset = zero_offset(shape.rank);
    position = 0;
    for (std::size_t q = 0; q < pieces; ++q) {
      extents const block = piece(shapes[q], me);
      copy_box(received.data() + position, block, zero_offset(shape.rank), data_of(out), result, offset, block, order);
      offset[cd] += block[cd];
      position += recv_counts[q];
    }
  }
}

/// Every rank's value of a small trivially copyable record, on any backend.
template <class Comm, class V>
std::vector<V> gather_values(Comm const& comm, V const& mine) {
  static_assert(std::is_trivially_copyable_v<V>);
  if constexpr (Comm::shared_memory) {
    std::vector<V> all(static_cast<std::size_t>(comm.size()));
    comm.exchange(make_slot(&mine), "gather_values", [&](std::vector<thread_slot> const& slots) {
      for (std::size_t q = 0; q < slots.size(); ++q) all[q] = *static_cast<V const*>(slots[q].in);
    });
    return all;
  } else {
    return comm.all_gather_value(mine);
  }
}

/// MPI guarantees tags up to 32767; the MPI backend uses two per message.
inline void check_tag(int tag, collective_site const& site) {
  if (tag < 0 || tag > 16383) fail(site, ": tag ", tag, " is out of range; use a tag from 0 to 16383");
}

template <class Mesh>
constexpr bool require_1d_mesh() {
  static_assert(device_mesh<Mesh>, "shardwise::collective: the first argument must be a shardwise mesh");
  if constexpr (device_mesh<Mesh>) {
    static_assert(Mesh::ndim == 1,
                  "shardwise::collective: collectives run over one mesh axis; pass "
                  "mesh.axis<\"name\">() instead of the whole mesh");
    return Mesh::ndim == 1;
  }
  return false;
}

}  // namespace detail

// The public collectives take any type and explain, part by part, why one that is not a tensor is rejected
// (detail::check_tensor), rather than leaving the reader with an unsatisfied constraint.

/// Reduces t over the ranks of a 1-D mesh, in place; every rank gets the result.
template <class Mesh, class T, reduce_op Op = Sum>
  requires(!std::is_arithmetic_v<T>)
void all_reduce(Mesh const& mesh, T& t, Op = {}) {
  if constexpr (detail::require_1d_mesh<Mesh>() && detail::check_tensor<T>())
    detail::all_reduce_on(mesh.comm(0), t, detail::op_kind_of<Op>());
}

namespace detail {
/// One number seen as a rank-1 tensor of one element, for the scalar all_reduce.
template <class E>
struct scalar_cell {
  E value;
};
}  // namespace detail

// An internal specialization: \cond keeps it out of the API reference.
/// \cond
template <class E>
struct tensor_traits<detail::scalar_cell<E>> {
  using element_type = E;
  static constexpr std::size_t rank = 1;
  static constexpr storage_order order = storage_order::row_major;
  static extents shape(detail::scalar_cell<E> const&) { return {1}; }
  static E* data(detail::scalar_cell<E>& c) { return &c.value; }
  static E const* data(detail::scalar_cell<E> const& c) { return &c.value; }
};
/// \endcond

/// Reduces one number over the ranks of a 1-D mesh and returns the result, the same on every rank (in rank
/// order, so threads and MPI agree to the bit): float loss = sw::all_reduce(dp, local_loss, sw::Avg{}).
template <class Mesh, class S, reduce_op Op = Sum>
  requires std::is_arithmetic_v<S>
[[nodiscard]] S all_reduce(Mesh const& mesh, S value, Op = {}) {
  detail::scalar_cell<S> cell{value};
  if constexpr (detail::require_1d_mesh<Mesh>()) detail::all_reduce_on(mesh.comm(0), cell, detail::op_kind_of<Op>());
  return cell.value;
}

/// Concatenates every rank's `in` along dimension `dim` (negative counts from the end) into `out`, in rank
/// order. Pieces may differ in size along `dim` and nowhere else.
template <class Mesh, class In, class Out>
void all_gather(Mesh const& mesh, In const& in, Out& out, int dim) {
  if constexpr (detail::require_1d_mesh<Mesh>() && detail::check_tensor<In>() && detail::check_tensor<Out>())
    detail::all_gather_on(mesh.comm(0), in, out, dim);
}

/// Reduces `in` over the ranks and leaves this rank's torch.chunk piece along `dim` in `out`.
template <class Mesh, class In, class Out, reduce_op Op = Sum>
void reduce_scatter(Mesh const& mesh, In const& in, Out& out, int dim, Op = {}) {
  if constexpr (detail::require_1d_mesh<Mesh>() && detail::check_tensor<In>() && detail::check_tensor<Out>())
    detail::reduce_scatter_on(mesh.comm(0), in, out, dim, detail::op_kind_of<Op>());
}

/// Copies root's tensor to every rank (resizing where the type allows).
template <class Mesh, class T>
void broadcast(Mesh const& mesh, T& t, int root = 0) {
  if constexpr (detail::require_1d_mesh<Mesh>() && detail::check_tensor<T>())
    detail::broadcast_on(mesh.comm(0), t, root);
}

/// Cuts `in` along split_dim into one torch.chunk piece per rank, sends piece q to rank q, and concatenates
/// what arrives along concat_dim in rank order.
template <class Mesh, class In, class Out>
void all_to_all(Mesh const& mesh, In const& in, Out& out, int split_dim, int concat_dim) {
  if constexpr (detail::require_1d_mesh<Mesh>() && detail::check_tensor<In>() && detail::check_tensor<Out>())
    detail::all_to_all_on(mesh.comm(0), in, out, split_dim, concat_dim);
}

/// Sends t to rank `destination` of the axis; returns once the data is buffered or delivered.
template <class Mesh, class T>
void send(Mesh const& mesh, T const& t, int destination, int tag = 0) {
  if constexpr (detail::require_1d_mesh<Mesh>() && detail::check_tensor<T>()) {
    detail::check_tag(tag, {"send", mesh.comm(0).label()});
    auto const shape = shape_of(t);
    mesh.comm(0).send_bytes(detail::traits_of<T>::data(t), shape.elements() * sizeof(element_t<T>), shape, destination,
                            tag);
  }
}

/// Receives into t what rank `source` sent with `tag` (resizing t where the type allows).
template <class Mesh, class T>
void recv(Mesh const& mesh, T& t, int source, int tag = 0) {
  if constexpr (detail::require_1d_mesh<Mesh>() && detail::check_tensor<T>()) {
    using E = element_t<T>;
    auto const& comm = mesh.comm(0);
    detail::collective_site const site{"recv", comm.label()};
    detail::check_tag(tag, site);
    // Straight into the tensor once its shape is checked: a large shard is never held twice.
    comm.recv_into(source, tag, [&](extents const& shape, std::size_t bytes) -> void* {
      if (bytes != shape.elements() * sizeof(E))
        detail::fail(site, ": rank ", source, " sent ", bytes, " bytes for shape ", shape, ", but ",
                     shape.elements() * sizeof(E), " are needed for this element type; send and receive the same type");
      if (shape.rank != shape_of(t).rank && rank_v<T> != dynamic_rank)
        detail::fail(site, ": rank ", source, " sent a tensor of shape ", shape, " to a tensor of rank ",
                     shape_of(t).rank);
      detail::prepare_output(t, shape, site);
      return data_of(t);
    });
  }
}

/// Waits until every rank of the mesh arrives.
template <device_mesh Mesh>
void barrier(Mesh const& mesh) {
  mesh.world().barrier();
}

}  // namespace shardwise

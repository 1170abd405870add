#pragma once
// Collectives on tensors along any dimension, over a 1-D mesh (mesh.axis<"tp">()). This layer describes the
// call (kind, element type, shape, dimensions, reduction, root, and its number on the communicator) and hands
// it to the backend's algorithms (Comm::collectives). Every backend checks on every rank that all ranks made
// the same call, with shapes that fit, before data moves, so a mismatch raises the same error everywhere
// instead of corrupting memory or hanging.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardwise/mesh/call.hpp"
#include "shardwise/mesh/call_checks.hpp"
#include "shardwise/mesh/mesh.hpp"
#include "shardwise/mesh/pending.hpp"
#include "shardwise/mesh/thread/comm.hpp"  // the backend every build has: users of the collectives get run_threads
#include "shardwise/placement/chunk.hpp"
#include "shardwise/placement/placement.hpp"
#include "shardwise/tensor/box.hpp"
#include "shardwise/tensor/concept.hpp"

namespace shardwise {

namespace detail {

template <class Comm, tensor T>
void all_reduce_on(Comm const& comm, T& t, op_kind op, call_site where = {}) {
  auto call = make_call<element_t<T>>(comm, collective_kind::all_reduce, shape_of(t), storage_order::row_major, where);
  call.op = op;
  Comm::collectives::all_reduce(comm, data_of(t), call, site_of(comm, "all_reduce"));
}

/// An all-gather's call record and site, checked: the same element type in and out, no aliasing, a dimension
/// that exists. `kind` tells a blocking gather from a started one.
template <class Comm, tensor In, tensor Out>
std::pair<call_record, collective_site> gather_call(Comm const& comm, In const& in, Out const& out, int dim,
                                                    collective_kind kind, call_site where) {
  check_same_element<In, Out>();
  auto const site = site_of(comm, kind_name(kind).data());
  check_not_aliased(in, out, site);
  auto call = make_call<element_t<In>>(comm, kind, shape_of(in), traits_of<In>::order, where);
  call.dim = static_cast<std::int16_t>(normalize_dim(dim, call.shape.rank, site));
  return {call, site};
}

template <class Comm, tensor In, tensor Out>
void all_gather_on(Comm const& comm, In const& in, Out& out, int dim, call_site where = {}) {
  auto const [call, site] = gather_call(comm, in, out, dim, collective_kind::all_gather, where);
  Comm::collectives::all_gather(comm, traits_of<In>::data(in), call, traits_of<In>::order, output_into(out, site),
                                site);
}

/// all_gather_on split in two: the ranks agree on the call and the transfer starts here; the returned
/// collective finishes it. Backends without a transfer of their own (threads: a rank copies its peers' pieces
/// itself) finish at once.
template <class Comm, tensor In, tensor Out>
[[nodiscard]] pending_collective all_gather_start_on(Comm const& comm, In const& in, Out& out, int dim,
                                                     call_site where = {}) {
  auto const [call, site] = gather_call(comm, in, out, dim, collective_kind::all_gather_start, where);
  return start_all_gather<typename Comm::collectives>(comm, traits_of<In>::data(in), call, traits_of<In>::order,
                                                      output_into(out, site), site);
}

template <class Comm, tensor In, tensor Out>
void reduce_scatter_on(Comm const& comm, In const& in, Out& out, int dim, op_kind op, call_site where = {}) {
  check_same_element<In, Out>();
  auto const site = site_of(comm, "reduce_scatter");
  check_not_aliased(in, out, site);
  auto call =
      make_call<element_t<In>>(comm, collective_kind::reduce_scatter, shape_of(in), traits_of<In>::order, where);
  call.dim = static_cast<std::int16_t>(normalize_dim(dim, call.shape.rank, site));
  call.op = op;
  Comm::collectives::reduce_scatter(comm, traits_of<In>::data(in), call, traits_of<In>::order, output_into(out, site),
                                    site);
}

template <class Comm, tensor T>
void broadcast_on(Comm const& comm, T& t, int root, call_site where = {}) {
  auto const site = site_of(comm, "broadcast");
  auto call = make_call<element_t<T>>(comm, collective_kind::broadcast, shape_of(t), storage_order::row_major, where);
  call.root = root;
  Comm::collectives::broadcast(comm, data_of(t), call, output_into(t, site), site);
}

template <class Comm, tensor In, tensor Out>
void all_to_all_on(Comm const& comm, In const& in, Out& out, int split_dim, int concat_dim, call_site where = {}) {
  check_same_element<In, Out>();
  auto const site = site_of(comm, "all_to_all");
  check_not_aliased(in, out, site);
  auto call = make_call<element_t<In>>(comm, collective_kind::all_to_all, shape_of(in), traits_of<In>::order, where);
  call.dim = static_cast<std::int16_t>(normalize_dim(split_dim, call.shape.rank, site));
  call.dim2 = static_cast<std::int16_t>(normalize_dim(concat_dim, call.shape.rank, site));
  Comm::collectives::all_to_all(comm, traits_of<In>::data(in), call, traits_of<In>::order, output_into(out, site),
                                site);
}

template <class Comm, tensor In, tensor Out>
std::vector<std::size_t> all_to_all_rows_on(Comm const& comm, In const& in, std::span<std::size_t const> rows_to,
                                            Out& out, call_site where = {}) {
  check_same_element<In, Out>();
  auto const site = site_of(comm, "all_to_all_rows");
  check_not_aliased(in, out, site);
  if (traits_of<In>::order != storage_order::row_major || rows_to.size() != static_cast<std::size_t>(comm.size()))
    fail(site, ": ", rows_to.size(), " counts of rows for ", comm.size(),
         " ranks, or a tensor not stored by rows; give a row-major tensor and one count per rank");
  auto call =
      make_call<element_t<In>>(comm, collective_kind::all_to_all_rows, shape_of(in), storage_order::row_major, where);
  std::vector<std::size_t> received(static_cast<std::size_t>(comm.size()));
  Comm::collectives::all_to_all_rows(comm, traits_of<In>::data(in), call, rows_to.data(), received.data(),
                                     output_into(out, site), site);
  return received;
}

/// Every rank's value of a small trivially copyable record, on any backend.
template <class Comm, class V>
std::vector<V> gather_values(Comm const& comm, V const& mine, call_site where = {}) {
  static_assert(std::is_trivially_copyable_v<V>);
  auto const call =
      make_call<V>(comm, collective_kind::gather_values, extents{sizeof(V)}, storage_order::row_major, where);
  return Comm::collectives::gather_values(comm, mine, call);
}

/// Waits until every rank of the axis arrives, checked like every collective.
template <class Comm>
void barrier_on(Comm const& comm, call_site where = {}) {
  auto const call = make_call<char>(comm, collective_kind::barrier, extents{}, storage_order::row_major, where);
  Comm::collectives::gather_values(comm, char{}, call);
}

/// The largest point-to-point tag: MPI guarantees tags up to 32767, and the MPI backend uses two per message.
inline constexpr int max_tag = 16383;

inline void check_tag(int tag, collective_site const& site) {
  if (tag < 0 || tag > max_tag) fail(site, ": tag ", tag, " is out of range; use a tag from 0 to ", max_tag);
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

// Every collective takes the caller's place (a defaulted shardwise::call_site): a mismatch or a timeout names
// the file and line of each rank's call.

/// Reduces t over the ranks of a 1-D mesh, in place; every rank gets the result.
template <class Mesh, class T, reduce_op Op = Sum>
  requires(!std::is_arithmetic_v<T>)
void all_reduce(Mesh const& mesh, T& t, Op = {}, call_site where = {}) {
  if constexpr (detail::require_1d_mesh<Mesh>() && detail::check_tensor<T>())
    detail::all_reduce_on(mesh.comm(0), t, detail::op_kind_of<Op>(), where);
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
[[nodiscard]] S all_reduce(Mesh const& mesh, S value, Op = {}, call_site where = {}) {
  detail::scalar_cell<S> cell{value};
  if constexpr (detail::require_1d_mesh<Mesh>())
    detail::all_reduce_on(mesh.comm(0), cell, detail::op_kind_of<Op>(), where);
  return cell.value;
}

/// Concatenates every rank's `in` along dimension `dim` (negative counts from the end) into `out`, in rank
/// order. Pieces may differ in size along `dim` and nowhere else.
template <class Mesh, class In, class Out>
void all_gather(Mesh const& mesh, In const& in, Out& out, int dim, call_site where = {}) {
  if constexpr (detail::require_1d_mesh<Mesh>() && detail::check_tensor<In>() && detail::check_tensor<Out>())
    detail::all_gather_on(mesh.comm(0), in, out, dim, where);
}

/// all_gather that returns before the data has moved, so a rank can compute meanwhile (FSDP's prefetch):
/// `auto pending = sw::all_gather_start(dp, in, out, 0); ...; pending.wait();`. The ranks agree on the call at
/// the start, as for every collective; `in` and `out` must stay alive and untouched until wait() returns. On
/// MPI the transfer is a non-blocking MPI_Iallgather(v) that wait() completes under the timeout; on the thread
/// mesh the copy is done at the start (a rank copies its peers' pieces itself, so there is nothing to overlap).
template <class Mesh, class In, class Out>
[[nodiscard]] pending_collective all_gather_start(Mesh const& mesh, In const& in, Out& out, int dim,
                                                  call_site where = {}) {
  if constexpr (detail::require_1d_mesh<Mesh>() && detail::check_tensor<In>() && detail::check_tensor<Out>())
    return detail::all_gather_start_on(mesh.comm(0), in, out, dim, where);
  else
    return {};
}

/// Reduces `in` over the ranks and leaves this rank's torch.chunk piece along `dim` in `out`.
template <class Mesh, class In, class Out, reduce_op Op = Sum>
void reduce_scatter(Mesh const& mesh, In const& in, Out& out, int dim, Op = {}, call_site where = {}) {
  if constexpr (detail::require_1d_mesh<Mesh>() && detail::check_tensor<In>() && detail::check_tensor<Out>())
    detail::reduce_scatter_on(mesh.comm(0), in, out, dim, detail::op_kind_of<Op>(), where);
}

/// Copies root's tensor to every rank (resizing where the type allows).
template <class Mesh, class T>
void broadcast(Mesh const& mesh, T& t, int root = 0, call_site where = {}) {
  if constexpr (detail::require_1d_mesh<Mesh>() && detail::check_tensor<T>())
    detail::broadcast_on(mesh.comm(0), t, root, where);
}

/// Cuts `in` along split_dim into one torch.chunk piece per rank, sends piece q to rank q, and concatenates
/// what arrives along concat_dim in rank order.
template <class Mesh, class In, class Out>
void all_to_all(Mesh const& mesh, In const& in, Out& out, int split_dim, int concat_dim, call_site where = {}) {
  if constexpr (detail::require_1d_mesh<Mesh>() && detail::check_tensor<In>() && detail::check_tensor<Out>())
    detail::all_to_all_on(mesh.comm(0), in, out, split_dim, concat_dim, where);
}

/// Sends rows_to[j] of `in`'s rows (a row-major tensor; its rows in order: the first rows_to[0] to rank 0, the next
/// to rank 1, ...) to each rank j, and receives into `out` the rows every rank sends this one, in rank order (MPI's
/// Alltoallv, by rows). Returns how many rows came from each rank. The counts differ from rank to rank and are
/// exchanged first: every rank checks them all alike (each rank's add up to its rows, the rows are equally wide),
/// and a rank that sends or receives no rows still takes part.
template <class Mesh, class In, class Out>
std::vector<std::size_t> all_to_all_rows(Mesh const& mesh, In const& in, std::span<std::size_t const> rows_to, Out& out,
                                         call_site where = {}) {
  if constexpr (detail::require_1d_mesh<Mesh>() && detail::check_tensor<In>() && detail::check_tensor<Out>())
    return detail::all_to_all_rows_on(mesh.comm(0), in, rows_to, out, where);
  else
    return {};
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

/// Sends t to rank `destination` of the axis without waiting for its receive: the bytes are copied and sent in
/// the background (MPI_Isend; the shared-memory meshes buffer every send), so that neighbours that send to each
/// other before receiving cannot wait on each other, and a transfer overlaps the compute that follows it.
/// finish_posted_sends(mesh) waits for them.
template <class Mesh, class T>
void post_send(Mesh const& mesh, T const& t, int destination, int tag = 0) {
  if constexpr (detail::require_1d_mesh<Mesh>() && detail::check_tensor<T>()) {
    auto const& comm = mesh.comm(0);
    detail::check_tag(tag, {"post_send", comm.label()});
    auto const shape = shape_of(t);
    auto const bytes = shape.elements() * sizeof(element_t<T>);
    if constexpr (requires { comm.post_bytes(detail::traits_of<T>::data(t), bytes, shape, destination, tag); })
      comm.post_bytes(detail::traits_of<T>::data(t), bytes, shape, destination, tag);
    else
      comm.send_bytes(detail::traits_of<T>::data(t), bytes, shape, destination, tag);  // buffered there
  }
}

/// Waits until the sends post_send left in flight on the mesh's axis have been received (under the timeout).
template <class Mesh>
void finish_posted_sends(Mesh const& mesh) {
  if constexpr (requires { mesh.comm(0).finish_sends(); }) mesh.comm(0).finish_sends();
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
void barrier(Mesh const& mesh, call_site where = {}) {
  detail::barrier_on(mesh.world(), where);
}

}  // namespace shardwise

#pragma once
// A counting mesh: a communicator that wraps any backend's (threads, MPI, serial) and records, per rank and in
// order, every collective and point-to-point transfer that passes through it — kind, mesh axis, bytes —
// before handing it on unchanged. PyTorch's CommDebugMode counts at run time; here the record is the proof of
// a prediction made at compile time (sw::cost), compared entry for entry.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

#include "shardwise/cost/transfer.hpp"
#include "shardwise/mesh/call.hpp"
#include "shardwise/mesh/mesh.hpp"
#include "shardwise/mesh/pending.hpp"

namespace shardwise {

/// What one rank's counting communicator (and every axis split from it) recorded, in order; identical calls in
/// a row are one entry with a count, as in sw::transfer_list.
class transfer_log {
 public:
  /// Appends `t`, merging it into the last entry when it is the same call.
  void add(transfer const& t) {
    std::lock_guard lock(mutex_);  // one rank records; the lock only guards against a user's helper thread
    if (!items_.empty() && items_.back().same_call(t))
      items_.back().count += t.count;
    else
      items_.push_back(t);
  }
  /// The entries so far (a copy: the log may still grow).
  [[nodiscard]] std::vector<transfer> entries() const {
    std::lock_guard lock(mutex_);
    return items_;
  }
  /// Forgets everything recorded so far (to record one step, say).
  void clear() {
    std::lock_guard lock(mutex_);
    items_.clear();
  }

 private:
  mutable std::mutex mutex_;
  std::vector<transfer> items_;
};

/// Whether a recorded run equals a prediction: the same entries (kind, axis, bytes, count) in the same order.
template <std::size_t N>
[[nodiscard]] bool operator==(std::vector<transfer> const& recorded, transfer_list<N> const& predicted) {
  return std::equal(recorded.begin(), recorded.end(), predicted.begin(), predicted.end());
}

/// A counting mesh's record summed by kind: the calls and bytes (of each call's input on this rank) of the four
/// collectives that move activations and gradients.
struct collective_count {
  /// @{ Calls of each kind.
  std::size_t all_reduce = 0, all_gather = 0, reduce_scatter = 0, all_to_all = 0;
  /// @}
  /// @{ Bytes of each kind's inputs on this rank.
  std::size_t all_reduce_bytes = 0, all_gather_bytes = 0, reduce_scatter_bytes = 0, all_to_all_bytes = 0;
  /// @}
  /// Calls of every kind.
  [[nodiscard]] std::size_t calls() const { return all_reduce + all_gather + reduce_scatter + all_to_all; }
  /// Bytes of every kind.
  [[nodiscard]] std::size_t bytes() const {
    return all_reduce_bytes + all_gather_bytes + reduce_scatter_bytes + all_to_all_bytes;
  }
};

/// The record `entries` (counted.log().entries()) summed by kind; other transfers (barriers, small gathers of
/// shapes, point-to-point) are left out.
inline collective_count count_of(std::vector<transfer> const& entries) {
  collective_count c;
  auto const add = [](std::size_t& calls, std::size_t& bytes, transfer const& t) {
    calls += t.count, bytes += t.count * t.bytes;
  };
  for (auto const& t : entries) {
    if (t.kind == transfer_kind::all_reduce) add(c.all_reduce, c.all_reduce_bytes, t);
    if (t.kind == transfer_kind::all_gather) add(c.all_gather, c.all_gather_bytes, t);
    if (t.kind == transfer_kind::reduce_scatter) add(c.reduce_scatter, c.reduce_scatter_bytes, t);
    if (t.kind == transfer_kind::all_to_all) add(c.all_to_all, c.all_to_all_bytes, t);
  }
  return c;
}

template <communicator Inner>
class CountingComm;

namespace detail {

constexpr transfer_kind transfer_kind_of(collective_kind kind) {
  switch (kind) {
    case collective_kind::all_reduce:
      return transfer_kind::all_reduce;
    case collective_kind::all_gather:
    case collective_kind::all_gather_start:
      return transfer_kind::all_gather;
    case collective_kind::reduce_scatter:
      return transfer_kind::reduce_scatter;
    case collective_kind::broadcast:
      return transfer_kind::broadcast;
    case collective_kind::all_to_all:
    case collective_kind::all_to_all_rows:
      return transfer_kind::all_to_all;
    case collective_kind::barrier:
      return transfer_kind::barrier;
    default:
      return transfer_kind::gather_values;
  }
}

template <class Collectives>
struct background_transfers {};
template <class Collectives>
  requires requires { Collectives::transfers_in_background; }
struct background_transfers<Collectives> {
  static constexpr bool transfers_in_background = Collectives::transfers_in_background;
};

/// The inner backend's collectives, each recorded on the calling rank's log first.
template <class Inner>
struct counting_collectives : background_transfers<typename Inner::collectives> {
  using inner = typename Inner::collectives;
  using comm = CountingComm<Inner>;

  template <class E>
  static void note(comm const& c, call_record const& call) {
    std::size_t const bytes = call.kind == collective_kind::barrier ? 0 : call.shape.elements() * sizeof(E);
    c.log().add({transfer_kind_of(call.kind), c.label(), bytes, 1});
  }

  template <class E>
  static void all_reduce(comm const& c, E* data, call_record const& call, collective_site const& site) {
    note<E>(c, call);
    inner::all_reduce(c.inner(), data, call, site);
  }
  template <class E, class Output>
  static void all_gather(comm const& c, E const* data, call_record const& call, storage_order order, Output&& output,
                         collective_site const& site) {
    note<E>(c, call);
    inner::all_gather(c.inner(), data, call, order, std::forward<Output>(output), site);
  }
  template <class E, class Output>
  static pending_collective all_gather_start(comm const& c, E const* data, call_record const& call, storage_order order,
                                             Output&& output, collective_site const& site) {
    note<E>(c, call);
    return inner::all_gather_start(c.inner(), data, call, order, std::forward<Output>(output), site);
  }
  template <class E, class Output>
  static void reduce_scatter(comm const& c, E const* data, call_record const& call, storage_order order,
                             Output&& output, collective_site const& site) {
    note<E>(c, call);
    inner::reduce_scatter(c.inner(), data, call, order, std::forward<Output>(output), site);
  }
  template <class E, class Output>
  static void broadcast(comm const& c, E* data, call_record const& call, Output&& output, collective_site const& site) {
    note<E>(c, call);
    inner::broadcast(c.inner(), data, call, std::forward<Output>(output), site);
  }
  template <class E, class Output>
  static void all_to_all(comm const& c, E const* data, call_record const& call, storage_order order, Output&& output,
                         collective_site const& site) {
    note<E>(c, call);
    inner::all_to_all(c.inner(), data, call, order, std::forward<Output>(output), site);
  }
  template <class E, class Output>
  static void all_to_all_rows(comm const& c, E const* data, call_record const& call, std::size_t const* rows_to,
                              std::size_t* received, Output&& output, collective_site const& site) {
    note<E>(c, call);  // the rows it sends, as all_to_all counts its input
    inner::all_to_all_rows(c.inner(), data, call, rows_to, received, std::forward<Output>(output), site);
  }
  template <class V>
  static auto gather_values(comm const& c, V const& mine, call_record const& call) {
    note<char>(c, call);  // the record's shape is the value's size in bytes
    return inner::gather_values(c.inner(), mine, call);
  }
};

}  // namespace detail

/// A communicator that records every collective and transfer of the one it wraps (any backend) on this rank's
/// sw::transfer_log, shared by every axis split from it; build a mesh on it as on the backend's world:
///
///     auto counted = sw::counting(world);
///     auto mesh = sw::make_mesh<"dp", "tp">(counted, {2, 2});
///     ... train ...
///     counted.log().entries()  // every call, in order, with its axis and bytes
template <communicator Inner>
class CountingComm {
 public:
  /// The backend's collectives, recorded first.
  using collectives = detail::counting_collectives<Inner>;

  /// Wraps `inner`, recording on `log` (a new one when none is given).
  explicit CountingComm(Inner inner, std::shared_ptr<transfer_log> log = std::make_shared<transfer_log>())
      : inner_(std::move(inner)), log_(std::move(log)) {}

  [[nodiscard]] Inner const& inner() const { return inner_; }              ///< The wrapped communicator.
  [[nodiscard]] transfer_log& log() const { return *log_; }                ///< What this rank recorded.
  [[nodiscard]] int rank() const { return inner_.rank(); }                 ///< As the wrapped one.
  [[nodiscard]] int size() const { return inner_.size(); }                 ///< As the wrapped one.
  [[nodiscard]] std::string_view label() const { return inner_.label(); }  ///< The axis' name.
  /// As the wrapped one.
  [[nodiscard]] std::uint64_t next_call_number() const { return inner_.next_call_number(); }
  void set_timeout(timeout_duration limit) const { inner_.set_timeout(limit); }  ///< As the wrapped one.
  [[nodiscard]] timeout_duration timeout() const { return inner_.timeout(); }    ///< As the wrapped one.
  /// Recorded, then as the wrapped one.
  void barrier(char const* what = "barrier") const {
    log().add({transfer_kind::barrier, label(), 0, 1});
    inner_.barrier(what);
  }
  /// The split of the wrapped one, recording on the same log (a split itself is not a transfer of a step).
  [[nodiscard]] CountingComm split(int color, int key, std::string_view label) const {
    return CountingComm(inner_.split(color, key, label), log_);
  }

  /// Recorded, then as the wrapped one.
  void send_bytes(void const* data, std::size_t bytes, extents const& shape, int destination, int tag) const {
    log().add({transfer_kind::send, label(), bytes, 1});
    inner_.send_bytes(data, bytes, shape, destination, tag);
  }
  /// Recorded, then as the wrapped one (a non-blocking send where the backend has one).
  void post_bytes(void const* data, std::size_t bytes, extents const& shape, int destination, int tag) const
    requires requires(Inner const& i) { i.post_bytes(data, bytes, shape, destination, tag); }
  {
    log().add({transfer_kind::send, label(), bytes, 1});
    inner_.post_bytes(data, bytes, shape, destination, tag);
  }
  /// As the wrapped one.
  void finish_sends() const
    requires requires(Inner const& i) { i.finish_sends(); }
  {
    inner_.finish_sends();
  }
  /// As the wrapped one, recorded once the message's size is known.
  template <class Where>
  void recv_into(int source, int tag, Where&& where) const {
    inner_.recv_into(source, tag, [&](extents const& shape, std::size_t bytes) -> void* {
      log().add({transfer_kind::recv, label(), bytes, 1});
      return where(shape, bytes);
    });
  }
  /// As the wrapped one, recorded once the message has arrived.
  template <class Take>
  void recv_bytes(int source, int tag, Take&& take) const {
    inner_.recv_bytes(source, tag, [&](extents const& shape, auto const& bytes) {
      log().add({transfer_kind::recv, label(), static_cast<std::size_t>(bytes.size()), 1});
      take(shape, bytes);
    });
  }

 private:
  Inner inner_;
  std::shared_ptr<transfer_log> log_;
};

/// A counting communicator over `world` (sw::CountingComm): build the mesh on it and read its log().
template <communicator Inner>
[[nodiscard]] CountingComm<Inner> counting(Inner const& world) {
  return CountingComm<Inner>(world);
}

}  // namespace shardwise

#pragma once
// The collective algorithms of MpiComm. The ranks' call records are exchanged first (with the data itself
// where only two ranks gather), every rank checks them alike, and only then does data move: contiguous cases
// go straight to MPI, strided ones are packed once.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardwise/core/reduce.hpp"
#include "shardwise/mesh/call.hpp"
#include "shardwise/mesh/call_checks.hpp"
#include "shardwise/mesh/pending.hpp"
#include "shardwise/tensor/box.hpp"
#include "shardwise/tensor/extents.hpp"

namespace shardwise::detail {

/// The collectives of MpiComm; same signatures as shared_memory_collectives.
struct mpi_collectives {
  /// Every rank's call record, checked to describe the same call.
  template <class Comm>
  static std::vector<call_record> agree(Comm const& comm, call_record const& unspelled) {
    call_record const call = unspelled.spelled();  // its texts travel with it
    std::vector<call_record> calls;
    if (comm.size() == 2) {  // as gather_pair does, so a rank there meets this one (see gather_pair)
      call_record const theirs =
          comm.pair_exchange(call, static_cast<unsigned char const*>(nullptr), 0, &sends_data, dropping);
      calls = comm.rank() == 0 ? std::vector{call, theirs} : std::vector{theirs, call};
    } else {
      calls = comm.all_gather_records(call);
    }
    check_calls_agree(comm.size(), [&](int q) -> call_record const& { return at(calls, q); }, comm.label());
    return calls;
  }

  template <class Comm, class E>
  static void all_reduce(Comm const& comm, E* data, call_record const& call, collective_site const& site) {
    auto const calls = agree(comm, call);
    check_shapes_agree(comm.size(), [&](int q) { return at(calls, q).shape; }, max_rank, site);
    if (comm.size() == 1) return;
    std::size_t const n = call.shape.elements();
    comm.all_reduce(data, n, call.op);
    if (call.op == op_kind::avg) divide_by_ranks(data, n, comm.size());
  }

  template <class Comm, class E, class Output>
  static void all_gather(Comm const& comm, E const* data, call_record const& call, storage_order order, Output&& output,
                         collective_site const& site) {
    auto const d = static_cast<std::size_t>(call.dim);
    if (comm.size() == 2 && rows_outside(call.shape, d, order) == 1) return gather_pair(comm, data, call, output, site);
    auto const gathered = agree_on_gather(comm, call, output, site);
    if (rows_outside(call.shape, d, order) == 1) {  // pieces are contiguous in the output: gather in place
      comm.all_gatherv(data, gathered.out, gathered.counts);
      return;
    }
    std::vector<E> packed(gathered.result.elements());
    comm.all_gatherv(data, packed.data(), gathered.counts);
    extents offset = zero_offset(gathered.result.rank);
    std::size_t position = 0;
    for (int q = 0; q < comm.size(); ++q) {
      extents const& piece = gathered.calls[static_cast<std::size_t>(q)].shape;
      copy_box(packed.data() + position, piece, zero_offset(gathered.result.rank), gathered.out, gathered.result,
               offset, piece, order);
      offset[d] += piece[d];
      position += gathered.counts[static_cast<std::size_t>(q)];
    }
  }

  /// all_gather_start's transfer proceeds while the rank computes (MPI_Iallgather(v)).
  static constexpr bool transfers_in_background = true;

  /// The ranks agree first, as for all_gather; then the transfer starts and the returned collective completes
  /// it. Pieces that are not contiguous in the output are gathered at once (they need unpacking afterwards).
  template <class Comm, class E, class Output>
  static pending_collective all_gather_start(Comm const& comm, E const* data, call_record const& call,
                                             storage_order order, Output&& output, collective_site const& site) {
    auto const d = static_cast<std::size_t>(call.dim);
    if (comm.size() == 1 || rows_outside(call.shape, d, order) != 1) {
      all_gather(comm, data, call, order, output, site);
      return {};
    }
    auto const gathered = agree_on_gather(comm, call, output, site);
    return comm.start_all_gatherv(data, gathered.out, gathered.counts, call);
  }

  template <class Comm, class E, class Output>
  static void reduce_scatter(Comm const& comm, E const* data, call_record const& call, storage_order order,
                             Output&& output, collective_site const& site) {
    auto const calls = agree(comm, call);
    check_shapes_agree(comm.size(), [&](int q) { return at(calls, q).shape; }, max_rank, site);
    auto const d = static_cast<std::size_t>(call.dim);
    int const ranks = comm.size();
    extents const mine = piece_of(call.shape, d, ranks, comm.rank());
    E* const out = output(mine);
    std::vector<std::size_t> counts(calls.size());
    for (int q = 0; q < ranks; ++q) counts[static_cast<std::size_t>(q)] = piece_of(call.shape, d, ranks, q).elements();
    if (ranks == 1) {
      copy_elements(out, data, call.shape.elements());
    } else if (rows_outside(call.shape, d, order) == 1) {  // each rank's piece is contiguous in the input
      comm.reduce_scatterv(data, out, counts, call.op);
    } else {
      comm.reduce_scatterv(packed_by_rank(data, call.shape, d, ranks, order).data(), out, counts, call.op);
    }
    if (call.op == op_kind::avg && ranks > 1) divide_by_ranks(out, mine.elements(), ranks);
  }

  template <class Comm, class E, class Output>
  static void broadcast(Comm const& comm, E* data, call_record const& call, Output&& output,
                        collective_site const& site) {
    auto const calls = agree(comm, call);
    check_root(call.root, comm.size(), site);
    extents const& shape = at(calls, call.root).shape;
    E* const target = comm.rank() == call.root ? data : output(shape);
    comm.broadcast(target, shape.elements(), call.root);
  }

  template <class Comm, class E, class Output>
  static void all_to_all(Comm const& comm, E const* data, call_record const& call, storage_order order, Output&& output,
                         collective_site const& site) {
    auto const calls = agree(comm, call);
    auto shape_at = [&](int q) { return at(calls, q).shape; };
    auto const split = static_cast<std::size_t>(call.dim), concat = static_cast<std::size_t>(call.dim2);
    int const ranks = comm.size(), me = comm.rank();
    extents const result = all_to_all_shape(ranks, me, shape_at, split, concat, site);
    E* const out = output(result);
    std::vector<std::size_t> send_counts(calls.size()), recv_counts(calls.size());
    for (int q = 0; q < ranks; ++q) {
      send_counts[static_cast<std::size_t>(q)] = piece_of(call.shape, split, ranks, q).elements();
      recv_counts[static_cast<std::size_t>(q)] = piece_of(shape_at(q), split, ranks, me).elements();
    }
    std::vector<E> const send = packed_by_rank(data, call.shape, split, ranks, order);
    std::vector<E> received(result.elements());
    comm.all_to_allv(send.data(), send_counts, received.data(), recv_counts);
    extents offset = zero_offset(result.rank);
    std::size_t position = 0;
    for (int q = 0; q < ranks; ++q) {
      extents const block = piece_of(shape_at(q), split, ranks, me);
      copy_box(received.data() + position, block, zero_offset(block.rank), out, result, offset, block, order);
      offset[concat] += block[concat];
      position += recv_counts[static_cast<std::size_t>(q)];
    }
  }

  /// Sends rows_to[j] of its rows (in order) to each rank j; what arrives, in rank order, goes to `output`, and
  /// the rows from each rank to received[q]. The counts travel first, so every rank checks them all alike.
  template <class Comm, class E, class Output>
  static void all_to_all_rows(Comm const& comm, E const* data, call_record const& call, std::size_t const* rows_to,
                              std::size_t* received, Output&& output, collective_site const& site) {
    auto const calls = agree(comm, call);
    int const ranks = comm.size(), me = comm.rank();
    auto const count = static_cast<std::size_t>(ranks);
    std::vector<unsigned char> const bytes = comm.all_gather_bytes(rows_to, count * sizeof(std::size_t));
    std::vector<std::size_t> all(count * count);  // all[q * ranks + j]: rank q's rows for rank j
    std::memcpy(all.data(), bytes.data(), bytes.size());
    auto const shape_at = [&](int q) { return at(calls, q).shape; };
    auto const rows_of = [&](int q) { return all.data() + static_cast<std::size_t>(q) * count; };
    extents const result = rows_to_ranks_shape(ranks, me, shape_at, rows_of, site);
    std::size_t const width = row_elements(call.shape);
    for (int q = 0; q < ranks; ++q) {  // MPI counts are ints: every rank checks every rank's totals alike
      std::size_t sent = 0, received_by_q = 0;
      for (int j = 0; j < ranks; ++j) sent += rows_of(q)[j], received_by_q += rows_of(j)[q];
      if (std::max(sent, received_by_q) * width > static_cast<std::size_t>(std::numeric_limits<int>::max()))
        fail(site, ": rank ", q, " sends ", sent, " and receives ", received_by_q, " rows of ", width,
             " elements, beyond the ", std::numeric_limits<int>::max(),
             " elements MPI moves in one exchange; exchange fewer rows at a time");
    }
    E* const out = output(result);
    std::vector<std::size_t> send_counts(count), recv_counts(count);
    for (std::size_t q = 0; q < count; ++q) {
      send_counts[q] = rows_to[q] * width;
      received[q] = rows_of(static_cast<int>(q))[me];
      recv_counts[q] = received[q] * width;
    }
    comm.all_to_allv(data, send_counts, out, recv_counts);
  }

  /// Every rank's value of a small trivially copyable record.
  template <class Comm, class V>
  static std::vector<V> gather_values(Comm const& comm, V const& mine, call_record const& call) {
    agree(comm, call);  // records first, alone: every collective starts with a message of the same size
    return comm.all_gather_value(mine);
  }

 private:
  /// The torch.chunk pieces of `data` along d for every rank, each made contiguous, in rank order.
  template <class E>
  static std::vector<E> packed_by_rank(E const* data, extents const& shape, std::size_t d, int ranks,
                                       storage_order order) {
    std::vector<E> packed(shape.elements());
    std::size_t position = 0;
    for (int q = 0; q < ranks; ++q) {
      extents const piece = piece_of(shape, d, ranks, q);
      copy_box(data, shape, piece_offset(shape, d, ranks, q), packed.data() + position, piece, zero_offset(piece.rank),
               piece, order);
      position += piece.elements();
    }
    return packed;
  }

  static bool sends_data(call_record const& call) { return call.pair_data; }
  /// A pair_exchange placement that takes nothing: a peer's data (if it sent any) is received and dropped.
  static constexpr auto dropping = [](call_record const&) {
    return std::pair<unsigned char*, std::size_t>{nullptr, 0};
  };

  template <class V>
  static V const& at(std::vector<V> const& all, int q) {
    return all[static_cast<std::size_t>(q)];
  }

  /// What the ranks agreed on for an all-gather: their records, the result's shape, where it goes, and each
  /// rank's element count.
  template <class E>
  struct agreed_gather {
    std::vector<call_record> calls;
    extents result;
    E* out;
    std::vector<std::size_t> counts;
  };
  template <class Comm, class Output>
  static auto agree_on_gather(Comm const& comm, call_record const& call, Output&& output, collective_site const& site) {
    auto calls = agree(comm, call);
    auto const d = static_cast<std::size_t>(call.dim);
    extents const result = gathered_shape(comm.size(), [&](int q) { return at(calls, q).shape; }, d, site);
    auto* const out = output(result);
    std::vector<std::size_t> counts(calls.size());
    for (std::size_t q = 0; q < calls.size(); ++q) counts[q] = calls[q].shape.elements();
    return agreed_gather<std::remove_pointer_t<decltype(out)>>{std::move(calls), result, out, std::move(counts)};
  }

  /// all_gather on two ranks of contiguous pieces: the call record travels beside the data, so checking it
  /// costs no round trip of its own (a record exchange before MPI_Allgather cost 5-6% at 256 KiB). Every
  /// two-rank collective starts with the same record exchange (agree), and a rank whose peer's record says
  /// pair_data receives the data and drops it when the calls differ, so a mismatch leaves nothing pending.
  template <class Comm, class E, class Output>
  static void gather_pair(Comm const& comm, E const* data, call_record const& call, Output&& output,
                          collective_site const& site) {
    auto const d = static_cast<std::size_t>(call.dim);
    int const me = comm.rank();
    std::size_t const own_count = call.shape.elements();
    call_record mine = call.spelled();
    mine.pair_data = true;
    bool agreed = false;
    E* out = nullptr;
    call_record const peer = comm.pair_exchange(
        mine, data, own_count, &sends_data, [&](call_record const& theirs) -> std::pair<E*, std::size_t> {
          if (!theirs.same_call(call) || !theirs.pair_data ||
              shape_fingerprint(theirs.shape, d) != shape_fingerprint(call.shape, d))
            return {nullptr, 0};
          extents const result = gathered_shape(2, [&](int q) { return q == me ? call.shape : theirs.shape; }, d, site);
          out = output(result);
          agreed = true;
          return {out + (me == 0 ? own_count : 0), theirs.shape.elements()};
        });
    auto record_of = [&](int q) -> call_record const& { return q == me ? call : peer; };
    if (!agreed) {  // both ranks hold both records, so both raise the same error
      check_calls_agree(2, record_of, comm.label());
      gathered_shape(2, [&](int q) { return record_of(q).shape; }, d, site);
      fail(site, ": shapes differ across ranks");  // unreachable: the records differ in shape outside d
    }
    if (own_count != 0) std::memcpy(out + (me == 0 ? 0 : peer.shape.elements()), data, own_count * sizeof(E));
  }
};

}  // namespace shardwise::detail

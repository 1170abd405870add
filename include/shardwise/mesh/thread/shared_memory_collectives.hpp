#pragma once
// The collective algorithms of ranks that share memory (ThreadComm, SerialComm): every rank publishes its
// buffers and its call record in a slot, and after one barrier reads its peers' buffers directly, so a byte
// moves once. The records are compared before any rank touches a peer's buffer, so a mismatched call raises
// on every rank and never reads or writes memory it should not.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "shardwise/core/reduce.hpp"
#include "shardwise/mesh/call.hpp"
#include "shardwise/mesh/call_checks.hpp"
#include "shardwise/mesh/compiled_once.hpp"
#include "shardwise/placement/chunk.hpp"
#include "shardwise/tensor/box.hpp"
#include "shardwise/tensor/extents.hpp"

namespace shardwise::detail {

struct thread_group;

/// What one rank publishes to its group for a collective: its call (the key and shape that peers compare, and
/// the whole record, read only to report a mismatch), and its buffers. A cache line of its own start, so two
/// ranks writing their slots do not contend for one line.
struct alignas(64) thread_slot {
  // What every collective reads of every peer first, on one cache line: key, buffers, record.
  call_key key;
  void const* in = nullptr;
  void* out = nullptr;
  call_record const* call = nullptr;
  extents shape;
  std::int64_t a = 0, b = 0;
  std::size_t const* rows = nullptr;    // all_to_all_rows: this rank's rows for each rank
  std::shared_ptr<thread_group> group;  // used by split
};

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

/// The collectives of ThreadComm and SerialComm. Each takes this rank's call record and buffers; `output`
/// (where there is one) is called once with the result's shape and returns where the result goes.
struct shared_memory_collectives {
  /// Publishes `call` and the buffers, checks that every rank made the same call, then hands the slots to fn.
  template <class Comm, class Fn>
  static void exchange(Comm const& comm, call_record const& call, void const* in, void* out, Fn&& fn,
                       std::size_t const* rows = nullptr) {
    thread_slot mine;
    mine.key = call_key::of(call), mine.shape = call.shape, mine.call = &call, mine.in = in, mine.out = out;
    mine.rows = rows;
    comm.exchange(std::move(mine), kind_name(call.kind).data(), [&](std::vector<thread_slot> const& slots) {
      int const ranks = static_cast<int>(slots.size());
      auto const same_key = [&](thread_slot const& peer) { return peer.key == slots.front().key; };
      if (!std::all_of(slots.begin(), slots.end(), same_key)) [[unlikely]]
        report_disagreement(slots, comm.label());
      fn(slots, ranks);
    });
  }

  template <class Comm, class E>
  static void all_reduce(Comm const& comm, E* data, call_record const& call, collective_site const& site) {
    exchange(comm, call, data, data, [&](std::vector<thread_slot> const& slots, int ranks) {
      check_shapes_agree(ranks, [&](int q) { return shape(slots, q); }, max_rank, site);
      if (ranks == 1) return;
      // One pass: rank `me` reduces piece `me` of every buffer, in rank order, and writes the result into that
      // piece of every buffer. Only rank `me` touches piece `me` anywhere, so the exchange's two barriers
      // suffice, and each byte crosses between cores once (two passes with a copy-back measured 2-3x slower).
      std::size_t const n = call.shape.elements();
      auto const me = static_cast<std::size_t>(comm.rank());
      std::size_t const start = chunk_offset(n, slots.size(), me), count = chunk_size(n, slots.size(), me);
      dispatch_op(call.op, [&]<op_kind Op>() {
        if (ranks == 2) {  // one fused loop, stored straight into both buffers: ~2x faster than via a block
          reduce_pair<Op>(input<E>(slots, 0) + start, input<E>(slots, 1) + start, output<E>(slots, 0) + start,
                          output<E>(slots, 1) + start, count);
          return;
        }
        constexpr std::size_t block = 1024;
        E acc[block];
        for (std::size_t b = 0; b < count; b += block) {
          std::size_t const m = std::min(block, count - b);
          reduce_block_rank_order<Op>(acc, ranks, [&](int q) { return input<E>(slots, q) + start + b; }, m);
          for (int q = 0; q < ranks; ++q) copy_elements(output<E>(slots, q) + start + b, acc, m);
        }
      });
    });
  }

  template <class Comm, class E, class Output>
  static void all_gather(Comm const& comm, E const* data, call_record const& call, storage_order order, Output&& output,
                         collective_site const& site) {
    auto const d = static_cast<std::size_t>(call.dim);
    exchange(comm, call, data, nullptr, [&](std::vector<thread_slot> const& slots, int ranks) {
      extents const result = gathered_shape(ranks, [&](int q) { return shape(slots, q); }, d, site);
      E* const out = output(result);
      extents offset = zero_offset(result.rank);
      for (int q = 0; q < ranks; ++q) {
        copy_box(input<E>(slots, q), shape(slots, q), zero_offset(result.rank), out, result, offset, shape(slots, q),
                 order);
        offset[d] += shape(slots, q)[d];
      }
    });
  }

  template <class Comm, class E, class Output>
  static void reduce_scatter(Comm const& comm, E const* data, call_record const& call, storage_order order,
                             Output&& output, collective_site const& site) {
    auto const d = static_cast<std::size_t>(call.dim);
    exchange(comm, call, data, nullptr, [&](std::vector<thread_slot> const& slots, int ranks) {
      check_shapes_agree(ranks, [&](int q) { return shape(slots, q); }, max_rank, site);
      extents const mine = piece_of(call.shape, d, ranks, comm.rank());
      E* const result = output(mine);
      dispatch_op(call.op, [&]<op_kind Op>() {
        for_each_run(mine, zero_offset(mine.rank), call.shape, piece_offset(call.shape, d, ranks, comm.rank()), mine,
                     order, [&](std::size_t to, std::size_t from, std::size_t n) {
                       reduce_rank_order<Op>(result + to, ranks, [&](int q) { return input<E>(slots, q) + from; }, n);
                     });
      });
    });
  }

  template <class Comm, class E, class Output>
  static void broadcast(Comm const& comm, E* data, call_record const& call, Output&& output,
                        collective_site const& site) {
    exchange(comm, call, data, nullptr, [&](std::vector<thread_slot> const& slots, int ranks) {
      check_root(call.root, ranks, site);
      if (comm.rank() == call.root) return;
      extents const& from = shape(slots, call.root);
      copy_elements(output(from), input<E>(slots, call.root), from.elements());
    });
  }

  template <class Comm, class E, class Output>
  static void all_to_all(Comm const& comm, E const* data, call_record const& call, storage_order order, Output&& output,
                         collective_site const& site) {
    auto const split = static_cast<std::size_t>(call.dim), concat = static_cast<std::size_t>(call.dim2);
    int const me = comm.rank();
    exchange(comm, call, data, nullptr, [&](std::vector<thread_slot> const& slots, int ranks) {
      auto shape_at = [&](int q) { return shape(slots, q); };
      extents const result = all_to_all_shape(ranks, me, shape_at, split, concat, site);
      E* const out = output(result);
      extents offset = zero_offset(result.rank);
      for (int q = 0; q < ranks; ++q) {
        extents const block = piece_of(shape_at(q), split, ranks, me);
        copy_box(input<E>(slots, q), shape_at(q), piece_offset(shape_at(q), split, ranks, me), out, result, offset,
                 block, order);
        offset[concat] += block[concat];
      }
    });
  }

  /// Sends rows_to[j] of its rows (in order) to each rank j; what arrives, in rank order, goes to `output`, and
  /// the rows from each rank to received[q].
  template <class Comm, class E, class Output>
  static void all_to_all_rows(Comm const& comm, E const* data, call_record const& call, std::size_t const* rows_to,
                              std::size_t* received, Output&& output, collective_site const& site) {
    int const me = comm.rank();
    exchange(
        comm, call, data, nullptr,
        [&](std::vector<thread_slot> const& slots, int ranks) {
          auto const shape_at = [&](int q) { return shape(slots, q); };
          auto const rows_of = [&](int q) { return slots[static_cast<std::size_t>(q)].rows; };
          extents const result = rows_to_ranks_shape(ranks, me, shape_at, rows_of, site);
          E* out = output(result);
          std::size_t const width = row_elements(result);
          for (int q = 0; q < ranks; ++q) {
            std::size_t first = 0;  // rank q's first row for this rank
            for (int j = 0; j < me; ++j) first += rows_of(q)[j];
            std::size_t const count = rows_of(q)[me];
            received[q] = count;
            copy_elements(out, input<E>(slots, q) + first * width, count * width);
            out += count * width;
          }
        },
        rows_to);
  }

  /// Every rank's value of a small trivially copyable record.
  template <class Comm, class V>
  static std::vector<V> gather_values(Comm const& comm, V const& mine, call_record const& call) {
    std::vector<V> all(static_cast<std::size_t>(comm.size()));
    exchange(comm, call, &mine, nullptr, [&](std::vector<thread_slot> const& slots, int ranks) {
      for (int q = 0; q < ranks; ++q) all[static_cast<std::size_t>(q)] = *static_cast<V const*>(slot(slots, q).in);
    });
    return all;
  }

  /// The keys differ: compares the whole records and raises, on every rank alike, naming each rank's call, if the
  /// calls differ. Out of line and cold, so the error's formatting does not weigh on the inlined common path (it
  /// cost ~0.2 us per call inline).
  [[gnu::cold]] static void report_disagreement(std::vector<thread_slot> const& slots, std::string_view axis);

 private:
  static thread_slot const& slot(std::vector<thread_slot> const& slots, int q) {
    return slots[static_cast<std::size_t>(q)];
  }
  static extents const& shape(std::vector<thread_slot> const& slots, int q) { return slot(slots, q).shape; }
  template <class E>
  static E const* input(std::vector<thread_slot> const& slots, int q) {
    return static_cast<E const*>(slot(slots, q).in);
  }
  template <class E>
  static E* output(std::vector<thread_slot> const& slots, int q) {
    return static_cast<E*>(slot(slots, q).out);
  }

  template <op_kind Op, class E>
  static void reduce_pair(E const* in0, E const* in1, E* out0, E* out1, std::size_t count) {
    E const two = static_cast<E>(2);
    for (std::size_t i = 0; i < count; ++i) {
      E x = combine<Op>(in0[i], in1[i]);
      if constexpr (Op == op_kind::avg) x = static_cast<E>(x / two);
      out0[i] = x;
      out1[i] = x;
    }
  }
};

#if SHARDWISE_DETAIL_RUNTIME_BODIES
[[gnu::noinline, gnu::cold]] SHARDWISE_DETAIL_RUNTIME_ENTRY void shared_memory_collectives::report_disagreement(
    std::vector<thread_slot> const& slots, std::string_view axis) {
  check_calls_agree(
      static_cast<int>(slots.size()), [&](int q) -> call_record const& { return *slot(slots, q).call; }, axis);
}
#endif

}  // namespace shardwise::detail

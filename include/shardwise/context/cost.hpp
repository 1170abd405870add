#pragma once
// The transfers of attention across the cp ranks (ring_attention, ulysses_attention and their backward) on one
// rank, in the order the code sends and receives them, for the cost model: a counting mesh records the same
// list (tests/cases/cost_cases.hpp). constexpr, so that a plan's cost stays a compile-time value. An attention's
// shape-only run records them where its code calls sw::attend_causal (context/attend_meta.hpp).
#include <cstddef>

#include "shardwise/cost/context_inputs.hpp"
#include "shardwise/cost/cost.hpp"

namespace shardwise::detail {

/// The ring's transfers: each step posts the block at hand to the next rank and receives the next block; the
/// backward also passes each block's [dk | dv] on after adding this rank's share, and receives its own at the end.
/// block_bytes(o): the bytes of rank o's block.
template <class BlockBytes>
constexpr void ring_attention_transfers(context_inputs const& cp, BlockBytes block_bytes, cost& c) {
  std::size_t const p = cp.ranks, r = cp.rank;
  auto const owner = [&](std::size_t step) { return (r + p - step % p) % p; };
  for (std::size_t step = 0; step + 1 < p; ++step) {
    c.forward.add(transfer_kind::send, cp.axis, block_bytes(owner(step)));
    c.forward.add(transfer_kind::recv, cp.axis, block_bytes(owner(step + 1)));
  }
  for (std::size_t step = 0; step < p; ++step) {
    if (step + 1 < p) c.backward.add(transfer_kind::send, cp.axis, block_bytes(owner(step)));  // keys, values
    if (step > 0) c.backward.add(transfer_kind::recv, cp.axis, block_bytes(owner(step)));      // [dk | dv] so far
    c.backward.add(transfer_kind::send, cp.axis, block_bytes(owner(step)));                    // ... and on
    if (step + 1 < p) c.backward.add(transfer_kind::recv, cp.axis, block_bytes(owner(step + 1)));
  }
  c.backward.add(transfer_kind::recv, cp.axis, block_bytes(r));  // this rank's own [dk | dv], complete
}

/// One all-to-all exchange of Ulysses (to_heads: rows to whole sequences of heads; else back), of `width` bytes
/// per row and head group: sent to every other rank, then received from every other rank.
template <class Rows>
constexpr void ulysses_exchange(context_inputs const& cp, Rows rows, std::size_t width, bool to_heads,
                                transfer_list<>& list) {
  for (std::size_t to = 0; to < cp.ranks; ++to)
    if (to != cp.rank) list.add(transfer_kind::send, cp.axis, rows(to_heads ? cp.rank : to) * width);
  for (std::size_t from = 0; from < cp.ranks; ++from)
    if (from != cp.rank) list.add(transfer_kind::recv, cp.axis, rows(to_heads ? from : cp.rank) * width);
}

}  // namespace shardwise::detail

namespace shardwise {

/// The transfers of attention across the cp axis s.cp on one rank, forward and backward: s.tokens is this rank's
/// rows (its tokens of every sequence of the microbatch); q_cols and kv_cols this tp rank's query and key-value
/// columns. Nothing without a cp axis.
template <class T>
constexpr cost context_attention_cost(cost_inputs const& s, std::size_t q_cols, std::size_t kv_cols) {
  cost c;
  context_inputs const& cp = s.cp;
  if (cp.ranks <= 1) return c;
  std::size_t const batch = s.tokens / cp.tokens(cp.rank);
  auto const rows = [&](std::size_t rank) { return batch * cp.tokens(rank); };
  if (cp.method == context_method::ring) {
    detail::ring_attention_transfers(cp, [&](std::size_t o) { return rows(o) * 2 * kv_cols * sizeof(T); }, c);
    return c;
  }
  std::size_t const q = q_cols / cp.ranks * sizeof(T), kv = kv_cols / cp.ranks * sizeof(T);
  for (std::size_t width : {q, kv, kv}) detail::ulysses_exchange(cp, rows, width, true, c.forward);
  detail::ulysses_exchange(cp, rows, q, false, c.forward);
  for (std::size_t width : {q, q, kv, kv}) detail::ulysses_exchange(cp, rows, width, true, c.backward);
  for (std::size_t width : {q, kv, kv}) detail::ulysses_exchange(cp, rows, width, false, c.backward);
  return c;
}

}  // namespace shardwise

#pragma once
// The transfers of attention across the cp ranks (ring_attention, ulysses_attention and their backward) on one
// rank, in the order the code sends and receives them, for the cost model: a counting mesh records the same
// list (tests/cases/cost_cases.hpp). constexpr, so that a plan's cost stays a compile-time value. Also the whole
// attention's cost from its projections' (sw::attention_cost), which places those transfers among theirs.
#include <cstddef>

#include "shardwise/cost/context_inputs.hpp"
#include "shardwise/cost/cost.hpp"
#include "shardwise/nn/kernels/functional_attention.hpp"

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

/// What causal attention keeps for its backward besides q, k and v on one rank of s.tokens rows and `heads` query
/// heads of `head_dim` (this tp rank's): each query row's logsumexp per head; under all-to-all over s.cp, that of
/// the whole sequences of heads / cp heads; under the ring, also its output (the backward's softmax term spans
/// every block).
template <class T>
constexpr std::size_t context_attention_kept_bytes(cost_inputs const& s, std::size_t heads, std::size_t head_dim) {
  context_inputs const& cp = s.cp;
  if (cp.ranks > 1 && cp.method == context_method::all_to_all)
    return nn::attention_saved_bytes<T>(s.tokens / cp.tokens(cp.rank) * cp.sequence, heads / cp.ranks);
  std::size_t const ring_output = cp.ranks > 1 ? s.tokens * heads * head_dim * sizeof(T) : 0;
  return nn::attention_saved_bytes<T>(s.tokens, heads) + ring_output;
}

/// The shape of multi-head attention on one rank, for attention_cost: query and key-value features (all heads,
/// before tp), the query heads and their width, the sequence, and the ranks the heads are cut over (1: not cut).
struct attention_shape {
  std::size_t q_features = 0;   ///< Query (and output) features: heads x head_dim.
  std::size_t kv_features = 0;  ///< Key (and value) features, with any copies tp needs.
  std::size_t heads = 0;        ///< Query heads.
  std::size_t head_dim = 0;     ///< Each head's width.
  std::size_t sequence = 0;     ///< Tokens per sequence (the attention's panels span it).
  std::size_t head_ranks = 1;   ///< The ranks that cut the heads (tp where the projections cut them).
};

/// The cost of attention on one rank (GPT-2's and Llama's, and yours) from its four projections' costs: their
/// parameters; q, k, v and sw::context_attention_kept_bytes kept for the backward; the backward's transients at
/// their peak (the output projection's input gradient, the gradients of q, k and v, the two [block rows, sequence]
/// panels, the three input gradients); the transfers in the order the code makes them — q, k, v, across the cp
/// ranks, the output projection; backward in reverse, with q's, k's and v's backward last.
template <class T>
constexpr cost attention_cost(cost const& q, cost const& k, cost const& v, cost const& out, attention_shape const& a,
                              cost_inputs const& s) {
  cost total;
  total.hold(q).hold(k).hold(v).hold(out);
  std::size_t const n = a.head_ranks, projected = s.tokens * (a.q_features + 2 * a.kv_features) / n * sizeof(T);
  total.activation_bytes += projected + context_attention_kept_bytes<T>(s, a.heads / n, a.head_dim);
  total.working_bytes =
      out.activation_bytes + projected + nn::attention_panel_bytes<T>(a.sequence) + 3 * q.activation_bytes;
  cost const across = context_attention_cost<T>(s, a.q_features / n, a.kv_features / n);  // nothing without cp
  total.forward.append(q.forward).append(k.forward).append(v.forward).append(across.forward).append(out.forward);
  total.backward.append(out.backward).append(across.backward);
  total.backward.append(q.backward).append(k.backward).append(v.backward);
  return total;
}

}  // namespace shardwise

#pragma once
// Causal attention on shapes (sw::meta<T>, for sw::derived_cost): sw::attend_causal and its backward called on
// shape-only activations record what the real calls do on one rank — the transfers across the cp ranks
// (sw::context_attention_cost), the panels the kernels hold while they run, and what the forward keeps for the
// backward — so that a model's attention states its cost by running its own code.
#include <algorithm>
#include <cstddef>

#include "shardwise/context/cost.hpp"
#include "shardwise/cost/meta_trace.hpp"
#include "shardwise/nn/kernels/functional_attention.hpp"

namespace shardwise {

class context_parallel;

namespace nn {
/// What a shape-only causal attention keeps for its backward: the shapes of the real one's (the logsumexp; the
/// output where the backward needs it) and the sequence, which sizes the backward's panels.
template <class T>
struct attention_saved<meta<T>> {
  meta_matrix<T> logsumexp;  ///< [rows, heads] of the softmax statistics.
  meta_matrix<T> output;     ///< The output, kept under the ring.
  std::size_t sequence = 0;  ///< Tokens per sequence.
  std::size_t window = 0;    ///< The sliding window (0: none), which narrows the backward's panels.
};
}  // namespace nn

namespace detail {
/// `count` [block rows, sequence] panels ([block rows, block rows + window - 1] with a window), as the attention
/// kernels allocate them, on q's trace while they live.
template <class T>
constexpr meta_matrix<T> attention_panels(meta_matrix<T> const& q, std::size_t count, std::size_t sequence,
                                          std::size_t window = 0) {
  std::size_t const rows = std::min(nn::attention_block_rows, sequence);
  std::size_t const width = window ? std::min(sequence, rows + window - 1) : sequence;
  return q.like(static_cast<std::ptrdiff_t>(count * rows), static_cast<std::ptrdiff_t>(width));
}
}  // namespace detail

/// attend_causal on shapes (M = sw::meta<T>): this rank's forward transfers across the cp axis of the run's
/// inputs, the one [block rows, sequence] panel the kernel holds, and what it keeps: each query row's logsumexp per
/// head — under all-to-all, of whole sequences of its cp share of the heads — and under the ring the output too.
template <class M>
  requires is_meta_v<M>
constexpr void attend_causal(context_parallel const*, meta_matrix<typename M::element> const& q,
                             meta_matrix<typename M::element> const& k, meta_matrix<typename M::element> const&,
                             sequence_lengths const& sequences, std::size_t head_dim,
                             meta_matrix<typename M::element>& out, nn::attention_saved<M>& saved,
                             std::size_t window = 0) {
  using T = typename M::element;
  std::size_t const sequence = sequences.longest();
  meta_trace& trace = *q.trace();
  context_inputs const& cp = trace.inputs.cp;
  bool const across = cp.ranks > 1;
  auto const q_cols = static_cast<std::size_t>(q.cols()), heads = q_cols / head_dim;
  if (across) trace.add(context_attention_cost<T>(trace.inputs, q_cols, static_cast<std::size_t>(k.cols())).forward);
  (void)detail::attention_panels(q, 1, sequence, window);  // held while the kernel runs, then freed
  auto const rows = static_cast<std::size_t>(q.rows());
  if (across && cp.method == context_method::all_to_all)
    saved.logsumexp = q.like(static_cast<std::ptrdiff_t>(rows / cp.tokens(cp.rank) * cp.sequence),
                             static_cast<std::ptrdiff_t>(heads / cp.ranks));
  else
    saved.logsumexp = q.like(q.rows(), static_cast<std::ptrdiff_t>(heads));
  if (across && cp.method == context_method::ring) saved.output = out;
  saved.sequence = sequence, saved.window = window;
}

/// attend_causal_backward on shapes: this rank's backward transfers across the cp axis and the two
/// [block rows, sequence] panels the kernel holds while it runs.
template <class M>
  requires is_meta_v<M>
constexpr void attend_causal_backward(context_parallel const*, meta_matrix<typename M::element> const&,
                                      meta_matrix<typename M::element> const& q,
                                      meta_matrix<typename M::element> const& k,
                                      meta_matrix<typename M::element> const&, nn::attention_saved<M> const& saved,
                                      meta_matrix<typename M::element>&, meta_matrix<typename M::element>&,
                                      meta_matrix<typename M::element>&) {
  using T = typename M::element;
  meta_trace& trace = *q.trace();
  auto const q_cols = static_cast<std::size_t>(q.cols()), kv_cols = static_cast<std::size_t>(k.cols());
  if (trace.inputs.cp.ranks > 1)  // nothing moves across cp otherwise
    trace.add(context_attention_cost<T>(trace.inputs, q_cols, kv_cols).backward);
  (void)detail::attention_panels(q, 2, saved.sequence, saved.window);
}

}  // namespace shardwise

#pragma once
// Causal attention over sequences cut across a context-parallel axis by all-to-all (DeepSpeed-Ulysses): q, k and
// v are exchanged so that each rank holds the whole sequences for heads / cp of the heads, attends them with
// nn::causal_attention, and the output is exchanged back to the rows the rank holds. Two exchanges of the
// activations instead of cp - 1 ring steps, but the heads (and the key-value heads) must divide over cp. The
// exchange is pairwise (posted sends): the ranks hold different numbers of tokens when the cut is uneven.
#include <Eigen/Core>
#include <cstddef>

#include "shardwise/adapters/eigen.hpp"  // the blocks travel as Eigen matrices
#include "shardwise/context/ring_attention.hpp"
#include "shardwise/context/split.hpp"
#include "shardwise/mesh/collectives.hpp"
#include "shardwise/nn/kernels/functional_attention.hpp"

namespace shardwise::detail {

/// This rank's rows of every head [batch x tokens(rank), cp x width] -> the whole sequences of this rank's heads
/// [batch x sequence, width] (width: its heads' columns).
template <class Mesh, class T>
nn::matrix<T> rows_to_heads(Mesh const& cp, context_split const& split, nn::const_matrix_ref<T> local) {
  int const size = cp.size(), rank = cp.rank();
  Eigen::Index const width = local.cols() / size;
  Eigen::Index const batch = local.rows() / static_cast<Eigen::Index>(split.tokens(rank));
  nn::matrix<T> whole(batch * static_cast<Eigen::Index>(split.sequence), width), arriving;
  for (int to = 0; to < size; ++to)
    if (to != rank) post_send(cp, nn::matrix<T>(local.middleCols(to * width, width)), to);
  split.place_rows<T>(local.middleCols(rank * width, width), rank, whole);
  for (int from = 0; from < size; ++from) {
    if (from == rank) continue;
    recv(cp, arriving, from);
    split.place_rows<T>(arriving, from, whole);
  }
  finish_posted_sends(cp);
  return whole;
}

/// The inverse: the whole sequences of this rank's heads -> this rank's rows of every head.
template <class Mesh, class T>
nn::matrix<T> heads_to_rows(Mesh const& cp, context_split const& split, nn::const_matrix_ref<T> whole) {
  int const size = cp.size(), rank = cp.rank();
  Eigen::Index const width = whole.cols();
  Eigen::Index const batch = whole.rows() / static_cast<Eigen::Index>(split.sequence);
  nn::matrix<T> local(batch * static_cast<Eigen::Index>(split.tokens(rank)), size * width), arriving;
  for (int to = 0; to < size; ++to)
    if (to != rank) post_send(cp, split.rows_of<T>(whole, to), to);
  local.middleCols(rank * width, width) = split.rows_of<T>(whole, rank);
  for (int from = 0; from < size; ++from) {
    if (from == rank) continue;
    recv(cp, arriving, from);
    local.middleCols(from * width, width) = arriving;
  }
  finish_posted_sends(cp);
  return local;
}

/// The shape checks of ring attention, and heads that divide over cp.
template <class T>
context_attention_shape checked_ulysses_shape(char const* fn, context_split const& split, int cp_size, int rank,
                                              nn::const_matrix_ref<T> q, nn::const_matrix_ref<T> k,
                                              nn::const_matrix_ref<T> v, std::size_t head_dim, std::size_t block_rows) {
  auto const a = checked_context_shape<T>(fn, split, cp_size, rank, q, k, v, head_dim, block_rows);
  if (a.heads % cp_size != 0 || a.kv_heads % cp_size != 0)
    fail("shardwise::", fn, ": ", a.heads, " query and ", a.kv_heads, " key-value heads do not divide over ", cp_size,
         " context-parallel ranks; use ring_attention, or a cp size that divides the key-value heads");
  return a;
}

}  // namespace shardwise::detail

namespace shardwise {

/// ring_attention's contract, computed by all-to-all: the same arguments and result (equal up to the order of
/// floating-point sums; packed documents attend within themselves in the whole sequences). `saved` holds the logsumexp
/// of the whole sequences of this rank's heads. The query heads and the key-value heads must divide over the cp mesh.
template <class Mesh, std::floating_point T>
void ulysses_attention(Mesh const& cp, context_split const& split, nn::const_matrix_ref<T> q, nn::const_matrix_ref<T> k,
                       nn::const_matrix_ref<T> v, std::size_t head_dim, nn::matrix_ref<T> out,
                       nn::attention_saved<T>& saved, std::size_t block_rows = nn::attention_block_rows,
                       std::size_t window = 0, sequence_lengths const& documents = {}) {
  constexpr char const* fn = "ulysses_attention";
  (void)detail::checked_ulysses_shape<T>(fn, split, cp.size(), cp.rank(), q, k, v, head_dim, block_rows);
  detail::nn_check_shape(fn, "out [rows, heads * head_dim]", out, q.rows(), q.cols());
  nn::matrix<T> const wq = detail::rows_to_heads<Mesh, T>(cp, split, q);
  nn::matrix<T> const wk = detail::rows_to_heads<Mesh, T>(cp, split, k);
  nn::matrix<T> const wv = detail::rows_to_heads<Mesh, T>(cp, split, v);
  nn::matrix<T> whole_out(wq.rows(), wq.cols());
  auto const whole = documents.empty() ? sequence_lengths::every(split.sequence) : documents;
  (void)split.document_starts(documents, static_cast<std::size_t>(wq.rows()) / split.sequence, 0);  // checks them
  nn::causal_attention<T>(wq, wk, wv, whole, head_dim, whole_out, saved, block_rows, window);
  out = detail::heads_to_rows<Mesh, T>(cp, split, whole_out);
}

/// Backward of ulysses_attention: ring_attention_backward's contract (`out` is not read: the whole rows of each
/// head make the softmax's term locally). q, k, v are exchanged again rather than kept from the forward.
template <class Mesh, std::floating_point T>
void ulysses_attention_backward(Mesh const& cp, context_split const& split, nn::const_matrix_ref<T> dout,
                                nn::const_matrix_ref<T> q, nn::const_matrix_ref<T> k, nn::const_matrix_ref<T> v,
                                [[maybe_unused]] nn::const_matrix_ref<T> out, nn::attention_saved<T> const& saved,
                                nn::matrix_ref<T> dq, nn::matrix_ref<T> dk, nn::matrix_ref<T> dv,
                                std::size_t block_rows = nn::attention_block_rows) {
  constexpr char const* fn = "ulysses_attention_backward";
  (void)detail::checked_ulysses_shape<T>(fn, split, cp.size(), cp.rank(), q, k, v,
                                         static_cast<std::size_t>(saved.head_dim), block_rows);
  detail::check_context_gradients<T>(fn, q, k, dout, dq, dk, dv);
  nn::matrix<T> const wdo = detail::rows_to_heads<Mesh, T>(cp, split, dout);
  nn::matrix<T> const wq = detail::rows_to_heads<Mesh, T>(cp, split, q);
  nn::matrix<T> const wk = detail::rows_to_heads<Mesh, T>(cp, split, k);
  nn::matrix<T> const wv = detail::rows_to_heads<Mesh, T>(cp, split, v);
  nn::matrix<T> wdq(wq.rows(), wq.cols()), wdk(wk.rows(), wk.cols()), wdv(wv.rows(), wv.cols());
  nn::causal_attention_backward<T>(wdo, wq, wk, wv, saved, wdq, wdk, wdv, block_rows);
  dq = detail::heads_to_rows<Mesh, T>(cp, split, wdq);
  dk = detail::heads_to_rows<Mesh, T>(cp, split, wdk);
  dv = detail::heads_to_rows<Mesh, T>(cp, split, wdv);
}

}  // namespace shardwise

#pragma once
// Causal attention over sequences cut across a context-parallel axis (context_split), by ring: every rank keeps
// its queries and passes its keys and values around the ring, one block per step, merging each block into its
// result by the online softmax; the next block's transfer is posted before the current block's compute, so they
// overlap. The backward passes the blocks round again, with their dk, dv accumulating as they go and arriving
// back at their owner after the last step. Memory per rank: its own rows, two blocks, one query panel.
#include <Eigen/Core>
#include <cstddef>
#include <limits>
#include <vector>

#include "shardwise/adapters/eigen.hpp"  // the blocks travel as Eigen matrices
#include "shardwise/context/attention_block.hpp"
#include "shardwise/context/split.hpp"
#include "shardwise/mesh/collectives.hpp"
#include "shardwise/nn/kernels/functional_attention.hpp"

namespace shardwise::detail {

/// The sizes of a rank's part of attention across cp, checked against the split and the mesh.
template <class T>
context_attention_shape checked_context_shape(char const* fn, context_split const& split, int cp_size, int rank,
                                              nn::const_matrix_ref<T> q, nn::const_matrix_ref<T> k,
                                              nn::const_matrix_ref<T> v, std::size_t head_dim, std::size_t block_rows) {
  if (split.ranks != cp_size)
    fail("shardwise::", fn, ": the context_split is over ", split.ranks, " ranks but the cp mesh has ", cp_size,
         "; build the split with the cp axis's size");
  auto const n = static_cast<Eigen::Index>(split.tokens(rank)), d = static_cast<Eigen::Index>(head_dim);
  if (q.rows() == 0 || q.rows() % n != 0)
    fail("shardwise::", fn, ": q has ", q.rows(), " rows, not whole sequences of this rank's ", n,
         " tokens; give each rank its rows of every sequence (context_split::rows_of)");
  if (d == 0 || q.cols() % d != 0 || k.cols() % d != 0 || k.cols() == 0 || (q.cols() / d) % (k.cols() / d) != 0)
    fail("shardwise::", fn, ": ", q.cols(), " query and ", k.cols(), " key columns are not whole heads of ", head_dim,
         " with a whole number of query heads per key-value head; give q heads x head_dim and k, v kv_heads x "
         "head_dim columns, heads a multiple of kv_heads");
  if (block_rows == 0) fail("shardwise::", fn, ": block_rows is 0; give it at least one query row per panel");
  nn_check_shape(fn, "k [rows, kv_heads * head_dim]", k, q.rows(), k.cols());
  nn_check_shape(fn, "v [rows, kv_heads * head_dim]", v, q.rows(), k.cols());
  return {q.rows() / n, d, q.cols() / d, k.cols() / d, static_cast<Eigen::Index>(block_rows)};
}

/// The shapes of a cp attention backward's dout and its outputs dq, dk, dv (not resized: this rank's rows).
template <class T>
void check_context_gradients(char const* fn, nn::const_matrix_ref<T> q, nn::const_matrix_ref<T> k,
                             nn::const_matrix_ref<T> dout, nn::matrix_ref<T> dq, nn::matrix_ref<T> dk,
                             nn::matrix_ref<T> dv) {
  nn_check_shape(fn, "dout [rows, heads * head_dim]", dout, q.rows(), q.cols());
  nn_check_shape(fn, "dq [rows, heads * head_dim]", dq, q.rows(), q.cols());
  nn_check_shape(fn, "dk [rows, kv_heads * head_dim]", dk, q.rows(), k.cols());
  nn_check_shape(fn, "dv [rows, kv_heads * head_dim]", dv, q.rows(), k.cols());
}

}  // namespace shardwise::detail

namespace shardwise {

/// out = softmax(q k^T / sqrt(head_dim), causal) v over sequences cut across the cp mesh (a 1-D mesh, split's
/// ranks) as `split` says: q, out [batch x split.tokens(rank), heads * head_dim] and k, v [same rows,
/// kv_heads * head_dim] are this rank's rows of each sequence (context_split::rows_of), the mask applied by
/// global position, with a sliding `window` of keys per query if not 0 (Mistral's), and within packed documents
/// when `documents` gives their lengths (context_split::document_starts: back to back over the batch's
/// sequences, none crossing into the next). Equal to nn::causal_attention of the whole sequences (of the
/// documents), row for row. Fills `saved` (each of this rank's rows' logsumexp over every key, the window and the
/// documents) for ring_attention_backward.
template <class Mesh, std::floating_point T>
void ring_attention(Mesh const& cp, context_split const& split, nn::const_matrix_ref<T> q, nn::const_matrix_ref<T> k,
                    nn::const_matrix_ref<T> v, std::size_t head_dim, nn::matrix_ref<T> out,
                    nn::attention_saved<T>& saved, std::size_t block_rows = nn::attention_block_rows,
                    std::size_t window = 0, sequence_lengths const& documents = {}) {
  constexpr char const* fn = "ring_attention";
  int const size = cp.size(), rank = cp.rank();
  auto a = detail::checked_context_shape<T>(fn, split, size, rank, q, k, v, head_dim, block_rows);
  a.window = static_cast<Eigen::Index>(window);
  auto const starts = split.document_starts(documents, static_cast<std::size_t>(a.batch), rank);
  a.document_starts = starts;
  saved.rows = documents;
  detail::nn_check_shape(fn, "out [rows, heads * head_dim]", out, q.rows(), q.cols());
  saved.sequence = static_cast<Eigen::Index>(split.sequence), saved.head_dim = a.head_dim;
  saved.heads = a.heads, saved.kv_heads = a.kv_heads, saved.window = a.window;
  saved.logsumexp.setConstant(q.rows(), a.heads, -std::numeric_limits<T>::infinity());
  out.setZero();
  auto const mine = split.positions(rank);
  Eigen::Index const kv_cols = k.cols();
  nn::matrix<T> block(k.rows(), 2 * kv_cols), arriving, panel;  // [k | v] of the block at hand
  block << k, v;
  for (int step = 0; step < size; ++step) {
    int const owner = (rank - step + size) % size;
    if (step + 1 < size) post_send(cp, block, (rank + 1) % size);  // on its way while this rank computes
    auto const theirs = split.positions(owner);
    detail::attend_block<T>(q, {mine}, block.leftCols(kv_cols), block.rightCols(kv_cols), {theirs}, a, out,
                            saved.logsumexp, panel);
    if (step + 1 < size) {
      recv(cp, arriving, (rank - 1 + size) % size);
      block.swap(arriving);
    }
  }
  finish_posted_sends(cp);
}

/// Backward of ring_attention, given dout and the forward's out and saved: dq, dk, dv (assigned; this rank's
/// rows, a key-value head's gradient summed over the query heads that read it, from every rank's queries).
template <class Mesh, std::floating_point T>
void ring_attention_backward(Mesh const& cp, context_split const& split, nn::const_matrix_ref<T> dout,
                             nn::const_matrix_ref<T> q, nn::const_matrix_ref<T> k, nn::const_matrix_ref<T> v,
                             nn::const_matrix_ref<T> out, nn::attention_saved<T> const& saved, nn::matrix_ref<T> dq,
                             nn::matrix_ref<T> dk, nn::matrix_ref<T> dv,
                             std::size_t block_rows = nn::attention_block_rows) {
  constexpr char const* fn = "ring_attention_backward";
  int const size = cp.size(), rank = cp.rank();
  auto a = detail::checked_context_shape<T>(fn, split, size, rank, q, k, v, static_cast<std::size_t>(saved.head_dim),
                                            block_rows);
  a.window = saved.window;  // the forward's
  auto const starts = split.document_starts(saved.rows, static_cast<std::size_t>(a.batch), rank);
  a.document_starts = starts;
  if (saved.logsumexp.rows() != q.rows() || saved.logsumexp.cols() != a.heads ||
      saved.sequence != static_cast<Eigen::Index>(split.sequence) || saved.kv_heads != a.kv_heads)
    detail::fail("shardwise::", fn, ": `saved` is not from a ring_attention forward of these ", q.rows(), " rows, ",
                 q.cols(), " query and ", k.cols(), " key columns; call ring_attention on them first");
  detail::nn_check_shape(fn, "out [rows, heads * head_dim]", out, q.rows(), q.cols());
  detail::check_context_gradients<T>(fn, q, k, dout, dq, dk, dv);
  nn::matrix<T> const row_term = detail::attention_row_term<T>(dout, out, a.heads, a.head_dim);
  auto const mine = split.positions(rank);
  Eigen::Index const kv_cols = k.cols();
  int const next = (rank + 1) % size, previous = (rank - 1 + size) % size;
  constexpr int blocks = 0, gradients = 1;  // tags: the keys and values travel ahead of their gradients
  nn::matrix<T> block(k.rows(), 2 * kv_cols), share, arriving, panel, gradient;
  block << k, v;
  dq.setZero();
  for (int step = 0; step < size; ++step) {
    int const owner = (rank - step + size) % size;
    if (step + 1 < size) post_send(cp, block, next, blocks);
    auto const theirs = split.positions(owner);
    share.setZero(block.rows(), 2 * kv_cols);  // [dk | dv] of the block, from this rank's queries
    detail::attend_block_backward<T>(dout, q, {mine}, block.leftCols(kv_cols), block.rightCols(kv_cols), {theirs},
                                     saved.logsumexp, row_term, a, dq, share.leftCols(kv_cols),
                                     share.rightCols(kv_cols), panel, gradient);
    if (step > 0) {  // the ranks before this one have added their shares: add this one's, pass it on
      recv(cp, arriving, previous, gradients);
      share += arriving;
    }
    if (size > 1) post_send(cp, share, next, gradients);
    if (step + 1 < size) {
      recv(cp, arriving, previous, blocks);
      block.swap(arriving);
    }
  }
  if (size > 1) recv(cp, share, previous, gradients);  // this rank's own block, every rank's share added
  dk = share.leftCols(kv_cols);
  dv = share.rightCols(kv_cols);
  finish_posted_sends(cp);
}

}  // namespace shardwise

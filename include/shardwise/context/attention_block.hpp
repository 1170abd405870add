#pragma once
// The step of attention across context-parallel ranks: this rank's queries against one block of keys and values
// (its own or another rank's), each token at its global position, the causal mask (and a sliding window, if any)
// applied by position. The
// forward merges the block into a running result by its logsumexp (the online softmax: the result is always the
// attention over the blocks seen so far); the backward adds the block's share to dq and to the block's dk, dv,
// given the whole row's logsumexp and D = rowsum(dout * out) (the softmax's backward term, which no one block
// can compute). Blocked by query panels as nn::causal_attention is: nothing of size tokens x tokens exists.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>

#include "shardwise/nn/kernels/functional_types.hpp"

namespace shardwise::detail {

/// The sizes of one rank's part of a context-parallel attention: sequences in the batch, head sizes, and the
/// query panel height.
struct context_attention_shape {
  Eigen::Index batch, head_dim, heads, kv_heads, block_rows;
  Eigen::Index window = 0;  ///< a sliding window of keys per query (0: none)
  /// Packed documents: the global position where the document of each query row (batch x rows) begins, so that
  /// it sees only its own document's keys; empty: each row's document is its whole sequence.
  std::span<std::int64_t const> document_starts{};
  [[nodiscard]] Eigen::Index group() const { return heads / kv_heads; }
};

/// One side of a block: its rows (batch x positions.size(), sequence after sequence) and the global positions of
/// each sequence's rows, increasing.
struct positioned_rows {
  std::span<std::int64_t const> positions;
  /// How many of these rows a query at `position` sees (they are increasing: a prefix).
  [[nodiscard]] Eigen::Index visible_to(std::int64_t position) const {
    return std::upper_bound(positions.begin(), positions.end(), position) - positions.begin();
  }
  /// The first of these rows a query at `position` sees with a sliding `window` (0: none): the first at or after
  /// position - window + 1, and at or after `document_start`, where the query's document begins.
  [[nodiscard]] Eigen::Index first_seen_by(std::int64_t position, Eigen::Index window,
                                           std::int64_t document_start = 0) const {
    std::int64_t const from = std::max(window == 0 ? 0 : position - window + 1, document_start);
    return std::lower_bound(positions.begin(), positions.end(), from) - positions.begin();
  }
  [[nodiscard]] Eigen::Index count() const { return static_cast<Eigen::Index>(positions.size()); }
};

/// Where the document of query row `row` (of batch x rows) begins: 0 without packed documents.
inline std::int64_t document_start(context_attention_shape const& a, Eigen::Index row) {
  return a.document_starts.empty() ? 0 : a.document_starts[static_cast<std::size_t>(row)];
}

/// Calls f(b, h, g, first, rows, keys) for every sequence, query head and panel of query rows that may see a key
/// of the block (keys: how many of the block's keys its last row sees, the most any of its rows does).
template <class F>
void for_each_block_panel(context_attention_shape const& a, positioned_rows const& queries, positioned_rows const& keys,
                          F&& f) {
  for (Eigen::Index first = 0; first < queries.count(); first += a.block_rows) {
    Eigen::Index const rows = std::min(a.block_rows, queries.count() - first);
    Eigen::Index const seen = keys.visible_to(queries.positions[static_cast<std::size_t>(first + rows - 1)]);
    if (seen == 0) continue;  // the whole block is in these queries' future
    if (keys.first_seen_by(queries.positions[static_cast<std::size_t>(first)], a.window) >= seen)
      continue;  // and behind every window: each row's starts at or after the first row's
    for (Eigen::Index b = 0; b < a.batch; ++b)
      for (Eigen::Index h = 0; h < a.heads; ++h) f(b, h, h / a.group(), first, rows, seen);
  }
}

/// Merges attention of q (at queries' positions) over the block k, v (at keys' positions) into out and its
/// logsumexp [rows, heads] (start: out zero, logsumexp -infinity). `panel` is scratch.
template <class T>
void attend_block(nn::const_matrix_ref<T> q, positioned_rows const& queries, nn::const_matrix_ref<T> k,
                  nn::const_matrix_ref<T> v, positioned_rows const& keys, context_attention_shape const& a,
                  nn::matrix_ref<T> out, nn::matrix_ref<T> logsumexp, nn::matrix<T>& panel) {
  Eigen::Index const d = a.head_dim, nq = queries.count(), nk = keys.count();
  T const scale = T(1) / std::sqrt(static_cast<T>(d));
  panel.resize(a.block_rows, nk);
  for_each_block_panel(a, queries, keys, [&](auto b, auto h, auto g, auto first, auto rows, auto seen) {
    auto p = panel.topLeftCorner(rows, seen);
    p.noalias() = q.block(b * nq + first, h * d, rows, d) * k.block(b * nk, g * d, seen, d).transpose();
    Eigen::Matrix<T, Eigen::Dynamic, 1> block_lse(rows), inverse_sum(rows);
    for (Eigen::Index r = 0; r < rows; ++r) {
      auto const position = queries.positions[static_cast<std::size_t>(first + r)];
      Eigen::Index const c = keys.visible_to(position),
                         from =
                             std::min(keys.first_seen_by(position, a.window, document_start(a, b * nq + first + r)), c);
      if (c == from) {
        p.row(r).setZero();
        block_lse(r) = -std::numeric_limits<T>::infinity();
        continue;
      }
      auto row = p.row(r).segment(from, c - from);
      T const top = row.maxCoeff();
      row = ((row.array() - top) * scale).exp().matrix();
      T const sum = row.sum();
      inverse_sum(r) = T(1) / sum;  // applied to the output row: d values, not `seen`
      p.row(r).head(from).setZero(), p.row(r).tail(seen - c).setZero();
      block_lse(r) = top * scale + std::log(sum);
    }
    nn::matrix<T> const o = p * v.block(b * nk, g * d, seen, d);
    for (Eigen::Index r = 0; r < rows; ++r) {
      if (block_lse(r) == -std::numeric_limits<T>::infinity()) continue;
      T& lse = logsumexp(b * nq + first + r, h);
      T const merged = std::max(lse, block_lse(r)) +
                       std::log1p(std::exp(-std::abs(lse - block_lse(r))));  // log(e^lse + e^block), stably
      auto row = out.block(b * nq + first + r, h * d, 1, d);
      row = row * std::exp(lse - merged) + o.row(r) * (inverse_sum(r) * std::exp(block_lse(r) - merged));
      lse = merged;
    }
  });
}

/// The block's share of the backward: adds to dq and to the block's dk, dv. logsumexp [rows, heads] is the whole
/// row's (the forward's, over every block); row_term [rows, heads] is rowsum(dout * out) per head.
template <class T>
void attend_block_backward(nn::const_matrix_ref<T> dout, nn::const_matrix_ref<T> q, positioned_rows const& queries,
                           nn::const_matrix_ref<T> k, nn::const_matrix_ref<T> v, positioned_rows const& keys,
                           nn::const_matrix_ref<T> logsumexp, nn::const_matrix_ref<T> row_term,
                           context_attention_shape const& a, nn::matrix_ref<T> dq, nn::matrix_ref<T> dk,
                           nn::matrix_ref<T> dv, nn::matrix<T>& panel, nn::matrix<T>& gradient) {
  Eigen::Index const d = a.head_dim, nq = queries.count(), nk = keys.count();
  T const scale = T(1) / std::sqrt(static_cast<T>(d));
  panel.resize(a.block_rows, nk), gradient.resize(a.block_rows, nk);
  for_each_block_panel(a, queries, keys, [&](auto b, auto h, auto g, auto first, auto rows, auto seen) {
    auto const qi = q.block(b * nq + first, h * d, rows, d), dOi = dout.block(b * nq + first, h * d, rows, d);
    auto const kj = k.block(b * nk, g * d, seen, d), vj = v.block(b * nk, g * d, seen, d);
    auto p = panel.topLeftCorner(rows, seen);
    auto ds = gradient.topLeftCorner(rows, seen);
    p.noalias() = qi * kj.transpose();
    ds.noalias() = dOi * vj.transpose();  // d loss / d p
    for (Eigen::Index r = 0; r < rows; ++r) {
      Eigen::Index const i = b * nq + first + r;
      auto const position = queries.positions[static_cast<std::size_t>(first + r)];
      Eigen::Index const c = keys.visible_to(position),
                         from = std::min(keys.first_seen_by(position, a.window, document_start(a, i)), c);
      p.row(r).segment(from, c - from) =
          (p.row(r).segment(from, c - from).array() * scale - logsumexp(i, h)).exp().matrix();
      p.row(r).head(from).setZero(), p.row(r).tail(seen - c).setZero();
      ds.row(r) = p.row(r).cwiseProduct((ds.row(r).array() - row_term(i, h)).matrix());
    }
    dv.block(b * nk, g * d, seen, d).noalias() += p.transpose() * dOi;
    dq.block(b * nq + first, h * d, rows, d).noalias() += scale * ds * kj;
    dk.block(b * nk, g * d, seen, d).noalias() += scale * ds.transpose() * qi;
  });
}

/// rowsum(dout * out) per query row and head: [rows, heads].
template <class T>
nn::matrix<T> attention_row_term(nn::const_matrix_ref<T> dout, nn::const_matrix_ref<T> out, Eigen::Index heads,
                                 Eigen::Index head_dim) {
  nn::matrix<T> term(out.rows(), heads);
  for (Eigen::Index h = 0; h < heads; ++h)
    term.col(h) =
        dout.middleCols(h * head_dim, head_dim).cwiseProduct(out.middleCols(h * head_dim, head_dim)).rowwise().sum();
  return term;
}

}  // namespace shardwise::detail

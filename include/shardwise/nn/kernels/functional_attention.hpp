#pragma once
// Causal grouped-query attention over a batch of sequences (of one length, or of any lengths packed back to
// back: sw::sequence_lengths), forward and backward, as plain kernels on row-major [tokens, heads * head_dim]
// matrices: what a user's attention module (examples/blocks.hpp) and the Llama and GPT-2 models share. Each
// sequence attends to itself only; query head h reads key-value head h / group in place (no copies of k or v).
//
// Blocked: queries are taken a panel of `block_rows` rows at a time, each against only the keys it may see, so
// nothing of size sequence x sequence ever exists. The forward keeps, per query row and head, the log of its
// softmax denominator (logsumexp); the backward recomputes each panel's probabilities from it. Memory is linear
// in the sequence; the products are [block_rows, head_dim] x [head_dim, keys] GEMMs; the softmax runs over whole
// contiguous rows, vectorised by Eigen.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>

#include "shardwise/nn/kernels/functional_types.hpp"
#include "shardwise/nn/kernels/sequence_lengths.hpp"

namespace shardwise::nn {

/// Query rows causal_attention and its backward take at a time when not told: the transient panels are
/// 2 x 128 x sequence elements. 64 to 256 ran equally fast here (docs/benchmarks-long-sequences.md, "Long sequences").
inline constexpr std::size_t attention_block_rows = 128;

/// What the backward of causal_attention needs besides q, k and v: the logsumexp of every query row's scaled
/// scores per head, and the sizes.
template <class T>
struct attention_saved {
  matrix<T> logsumexp;  ///< [tokens, heads]: log sum_j exp(q_i k_j / sqrt(head_dim)) over the keys row i sees.
  /// The attention's output, where its backward needs it: across cp ranks by the ring, whose softmax term spans
  /// every block (sw::attend_causal keeps it); empty otherwise.
  matrix<T> output;
  /// The sizes causal_attention was called with (`sequence`: its longest sequence; `window`: its sliding window,
  /// 0 for none).
  /// @{
  Eigen::Index sequence = 0, head_dim = 0, heads = 0, kv_heads = 0, window = 0;
  /// @}
  sequence_lengths rows;  ///< The sequences it attended within.
};

/// Bytes of attention_saved<T> after a forward of `tokens` rows and `heads` query heads: what the attention
/// keeps for its backward besides q, k and v.
template <class T>
constexpr std::size_t attention_saved_bytes(std::size_t tokens, std::size_t heads) {
  return tokens * heads * sizeof(T);
}

/// Bytes of the two transient panels causal_attention_backward allocates for sequences of `sequence` tokens
/// (the forward needs one).
template <class T>
constexpr std::size_t attention_panel_bytes(std::size_t sequence, std::size_t block_rows = attention_block_rows) {
  return 2 * std::min(block_rows, sequence) * sequence * sizeof(T);
}

/// The keys a query row is scored against on average in causal_attention's forward: each panel of block_rows
/// queries meets every key up to its last row, so the causal half plus half a block. The backward's five products
/// meet as many; the planner counts attention FLOPs with it.
constexpr double attention_keys_per_query(std::size_t sequence, std::size_t block_rows = attention_block_rows) {
  if (sequence == 0 || block_rows == 0) return 0;
  double pairs = 0;
  for (std::size_t first = 0; first < sequence; first += block_rows) {
    std::size_t const rows = std::min(block_rows, sequence - first);
    pairs += static_cast<double>(rows) * static_cast<double>(first + rows);
  }
  return pairs / static_cast<double>(sequence);
}

}  // namespace shardwise::nn

namespace shardwise::detail {

/// The sizes of one attention call, checked; block_rows capped at the sequence.
struct attention_shape {
  Eigen::Index sequence, head_dim, heads, kv_heads, block_rows;
  Eigen::Index group() const { return heads / kv_heads; }
};

/// The sizes of q, k and v, or an error naming what does not fit.
template <class T>
attention_shape checked_attention_shape(char const* fn, nn::const_matrix_ref<T> q, nn::const_matrix_ref<T> k,
                                        nn::const_matrix_ref<T> v, sequence_lengths const& rows, std::size_t head_dim,
                                        std::size_t block_rows) {
  auto const s = static_cast<Eigen::Index>(rows.longest()), d = static_cast<Eigen::Index>(head_dim);
  if (!rows.uniform() && !rows.empty())
    rows.check(static_cast<std::size_t>(q.rows()), concat("shardwise::nn::", fn));
  else if (s == 0 || q.rows() % s != 0)
    fail("shardwise::nn::", fn, ": ", q.rows(), " tokens are not whole sequences of ", s,
         "; give it rows of whole sequences");
  if (d == 0 || q.cols() % d != 0 || k.cols() % d != 0 || k.cols() == 0 || (q.cols() / d) % (k.cols() / d) != 0)
    fail("shardwise::nn::", fn, ": ", q.cols(), " query and ", k.cols(), " key columns are not whole heads of ",
         head_dim,
         " with a whole number of query heads per key-value head; give q heads x head_dim and k, v "
         "kv_heads x head_dim columns, heads a multiple of kv_heads");
  if (block_rows == 0) fail("shardwise::nn::", fn, ": block_rows is 0; give it at least one query row per panel");
  nn_check_shape(fn, "k [tokens, kv_heads * head_dim]", k, q.rows(), k.cols());
  nn_check_shape(fn, "v [tokens, kv_heads * head_dim]", v, q.rows(), k.cols());
  return {s, d, q.cols() / d, k.cols() / d, std::min(static_cast<Eigen::Index>(block_rows), s)};
}

/// Runs f(sequence_start, head, kv_head, first, rows) over every sequence, query head and panel of query rows.
template <class F>
void for_each_attention_panel(sequence_lengths const& sequences, Eigen::Index tokens, attention_shape const& a, F&& f) {
  sequences.for_each(static_cast<std::size_t>(tokens), [&](std::size_t start, std::size_t length) {
    auto const b = static_cast<Eigen::Index>(start), n = static_cast<Eigen::Index>(length);
    for (Eigen::Index h = 0; h < a.heads; ++h)
      for (Eigen::Index first = 0; first < n; first += a.block_rows)
        f(b, h, h / a.group(), first, std::min(a.block_rows, n - first));
  });
}

/// The earliest key query row `row` of a sequence sees: itself and the window - 1 rows before it (window 0: all).
inline Eigen::Index first_key_seen(Eigen::Index row, Eigen::Index window) {
  return window > 0 ? std::max<Eigen::Index>(0, row - window + 1) : 0;
}

/// The keys a panel of query rows first .. first + rows - 1 scores: from the first row's earliest to the last row.
struct panel_keys {
  Eigen::Index from, count;
};
inline panel_keys keys_of_panel(Eigen::Index first, Eigen::Index rows, Eigen::Index window) {
  Eigen::Index const from = first_key_seen(first, window);
  return {from, first + rows - from};
}

/// The columns row r of a panel (query first + r, keys from `from`) sees: [begin, begin + count).
struct seen_columns {
  Eigen::Index begin, count;
};
inline seen_columns columns_seen(Eigen::Index first, Eigen::Index r, Eigen::Index from, Eigen::Index window) {
  Eigen::Index const begin = first_key_seen(first + r, window) - from;
  return {begin, first + r - from - begin + 1};
}

/// The widest panel a call makes: every key of the longest sequence, or with a window, the block's rows' keys.
inline Eigen::Index panel_width(attention_shape const& a, Eigen::Index window) {
  return window > 0 ? std::min(a.sequence, a.block_rows + window - 1) : a.sequence;
}

/// Each row of a panel (queries from `first`, keys from `from`) gets probability 0 on the keys it does not see:
/// the future's, and those before its window.
template <class Panel>
void mask_unseen(Panel&& p, Eigen::Index first, Eigen::Index from = 0, Eigen::Index window = 0) {
  for (Eigen::Index r = 0; r < p.rows(); ++r) {
    auto const seen = columns_seen(first, r, from, window);
    p.row(r).head(seen.begin).setZero();
    p.row(r).tail(p.cols() - seen.begin - seen.count).setZero();
  }
}

}  // namespace shardwise::detail

namespace shardwise::nn {

/// out = softmax(q k^T / sqrt(head_dim), causal) v for each sequence of `rows` and each query head; with a
/// `window` (Mistral's sliding_window), each query sees only itself and the window - 1 keys before it, and costs
/// that many. q, out [tokens, heads * head_dim]; k, v [tokens, kv_heads * head_dim]; heads a multiple of
/// kv_heads; `rows` the sequences, adding up to the tokens. Fills `saved` for causal_attention_backward. Holds at
/// most one [block_rows, sequence] panel besides its arguments ([block_rows, block_rows + window - 1] with one).
template <std::floating_point T>
void causal_attention(const_matrix_ref<T> q, const_matrix_ref<T> k, const_matrix_ref<T> v, sequence_lengths const& rows,
                      std::size_t head_dim, matrix_ref<T> out, attention_saved<T>& saved,
                      std::size_t block_rows = attention_block_rows, std::size_t window = 0) {
  constexpr char const* fn = "causal_attention";
  auto const a = detail::checked_attention_shape<T>(fn, q, k, v, rows, head_dim, block_rows);
  detail::nn_check_shape(fn, "out [tokens, heads * head_dim]", out, q.rows(), q.cols());
  auto const w = static_cast<Eigen::Index>(window);
  saved.sequence = a.sequence, saved.head_dim = a.head_dim, saved.heads = a.heads, saved.kv_heads = a.kv_heads;
  saved.window = w, saved.rows = rows;
  saved.logsumexp.resize(q.rows(), a.heads);
  T const scale = T(1) / std::sqrt(static_cast<T>(a.head_dim));
  Eigen::Index const d = a.head_dim;
  matrix<T> panel(a.block_rows, detail::panel_width(a, w));
  Eigen::Matrix<T, Eigen::Dynamic, 1> inverse_sum(a.block_rows);
  detail::for_each_attention_panel(
      rows, q.rows(), a, [&](Eigen::Index b, Eigen::Index h, Eigen::Index g, Eigen::Index first, Eigen::Index rows) {
        auto const keys = detail::keys_of_panel(first, rows, w);
        auto p = panel.topLeftCorner(rows, keys.count);
        p.noalias() = q.block(b + first, h * d, rows, d) * k.block(b + keys.from, g * d, keys.count, d).transpose();
        for (Eigen::Index r = 0; r < rows; ++r) {
          auto const columns = detail::columns_seen(first, r, keys.from, w);
          auto seen = p.row(r).segment(columns.begin, columns.count);
          T const top = seen.maxCoeff();
          seen = ((seen.array() - top) * scale).exp().matrix();
          T const sum = seen.sum();
          inverse_sum(r) = T(1) / sum;
          saved.logsumexp(b + first + r, h) = top * scale + std::log(sum);
        }
        detail::mask_unseen(p, first, keys.from, w);
        auto o = out.block(b + first, h * d, rows, d);
        o.noalias() = p * v.block(b + keys.from, g * d, keys.count, d);
        o.array().colwise() *= inverse_sum.head(rows).array();  // normalising here costs d, not keys, per row
      });
}

/// Backward of causal_attention, given dout: dq (assigned), dk and dv (assigned; a key-value head's gradient
/// sums over the query heads that read it). Recomputes each panel's probabilities from saved.logsumexp; holds at
/// most two [block_rows, sequence] panels besides its arguments.
template <std::floating_point T>
void causal_attention_backward(const_matrix_ref<T> dout, const_matrix_ref<T> q, const_matrix_ref<T> k,
                               const_matrix_ref<T> v, attention_saved<T> const& saved, matrix_ref<T> dq,
                               matrix_ref<T> dk, matrix_ref<T> dv, std::size_t block_rows = attention_block_rows) {
  constexpr char const* fn = "causal_attention_backward";
  auto const not_saved = [&] {
    detail::fail("shardwise::nn::", fn, ": `saved` is not from a causal_attention forward of these ", q.rows(),
                 " rows, ", q.cols(), " query and ", k.cols(), " key columns; call causal_attention on them first");
  };
  if (saved.sequence == 0 || saved.logsumexp.rows() != q.rows() || saved.logsumexp.cols() * saved.head_dim != q.cols())
    not_saved();
  sequence_lengths const sequences =
      saved.rows.empty() ? sequence_lengths::every(static_cast<std::size_t>(saved.sequence)) : saved.rows;
  auto const a =
      detail::checked_attention_shape<T>(fn, q, k, v, sequences, static_cast<std::size_t>(saved.head_dim), block_rows);
  if (a.kv_heads != saved.kv_heads) not_saved();  // the logsumexp would belong to other key-value heads
  Eigen::Index const d = a.head_dim;
  detail::nn_check_shape(fn, "dout [tokens, heads * head_dim]", dout, q.rows(), q.cols());
  detail::nn_check_shape(fn, "dq [tokens, heads * head_dim]", dq, q.rows(), q.cols());
  detail::nn_check_shape(fn, "dk [tokens, kv_heads * head_dim]", dk, q.rows(), k.cols());
  detail::nn_check_shape(fn, "dv [tokens, kv_heads * head_dim]", dv, q.rows(), k.cols());
  T const scale = T(1) / std::sqrt(static_cast<T>(d));
  Eigen::Index const w = saved.window;
  dk.setZero(), dv.setZero();
  Eigen::Index const width = detail::panel_width(a, w);
  matrix<T> probabilities(a.block_rows, width), gradient(a.block_rows, width);
  detail::for_each_attention_panel(
      sequences, q.rows(), a,
      [&](Eigen::Index b, Eigen::Index h, Eigen::Index g, Eigen::Index first, Eigen::Index rows) {
        auto const keys = detail::keys_of_panel(first, rows, w);
        auto const qi = q.block(b + first, h * d, rows, d);
        auto const dOi = dout.block(b + first, h * d, rows, d);
        auto const kj = k.block(b + keys.from, g * d, keys.count, d), vj = v.block(b + keys.from, g * d, keys.count, d);
        auto p = probabilities.topLeftCorner(rows, keys.count);
        auto ds = gradient.topLeftCorner(rows, keys.count);
        p.noalias() = qi * kj.transpose();
        ds.noalias() = dOi * vj.transpose();  // d loss / d p
        for (Eigen::Index r = 0; r < rows; ++r) {
          auto const columns = detail::columns_seen(first, r, keys.from, w);
          auto seen = p.row(r).segment(columns.begin, columns.count);
          seen = (seen.array() * scale - saved.logsumexp(b + first + r, h)).exp().matrix();
        }
        detail::mask_unseen(p, first, keys.from, w);
        for (Eigen::Index r = 0; r < rows; ++r)  // through the softmax: p * (dp - sum_j p_j dp_j)
          ds.row(r) = p.row(r).cwiseProduct((ds.row(r).array() - p.row(r).dot(ds.row(r))).matrix());
        dv.block(b + keys.from, g * d, keys.count, d).noalias() += p.transpose() * dOi;
        dq.block(b + first, h * d, rows, d).noalias() = scale * ds * kj;
        dk.block(b + keys.from, g * d, keys.count, d).noalias() += scale * ds.transpose() * qi;
      });
}

/// causal_attention over whole sequences of `sequence` rows each.
template <std::floating_point T>
void causal_attention(const_matrix_ref<T> q, const_matrix_ref<T> k, const_matrix_ref<T> v, std::size_t sequence,
                      std::size_t head_dim, matrix_ref<T> out, attention_saved<T>& saved,
                      std::size_t block_rows = attention_block_rows) {
  causal_attention<T>(q, k, v, sequence_lengths::every(sequence), head_dim, out, saved, block_rows);
}

}  // namespace shardwise::nn

// With SHARDWISE_SEPARATE_KERNELS defined, the attention kernels for float and double are declared here and compiled
// once, by the one file that includes <shardwise/compile_kernels.hpp> (CMake: link
// shardwise::separate_kernels), instead of in every file that calls them (docs/build-time.md).
#define SHARDWISE_DETAIL_ATTENTION_KERNELS(prefix, T)                                                                \
  prefix template void causal_attention<T>(const_matrix_ref<T>, const_matrix_ref<T>, const_matrix_ref<T>,            \
                                           sequence_lengths const&, std::size_t, matrix_ref<T>, attention_saved<T>&, \
                                           std::size_t, std::size_t);                                                \
  prefix template void causal_attention_backward<T>(const_matrix_ref<T>, const_matrix_ref<T>, const_matrix_ref<T>,   \
                                                    const_matrix_ref<T>, attention_saved<T> const&, matrix_ref<T>,   \
                                                    matrix_ref<T>, matrix_ref<T>, std::size_t);
#if defined(SHARDWISE_SEPARATE_KERNELS)
namespace shardwise::nn {
SHARDWISE_DETAIL_ATTENTION_KERNELS(extern, float)
SHARDWISE_DETAIL_ATTENTION_KERNELS(extern, double)
}  // namespace shardwise::nn
#endif

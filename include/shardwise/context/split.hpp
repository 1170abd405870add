#pragma once
// Context parallelism cuts each sequence over the ranks of a cp axis: a rank holds some of every sequence's
// tokens (its rows of q, k, v and of every activation), at known global positions. context_split says which.
#include <Eigen/Core>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "shardwise/core/error.hpp"
#include "shardwise/cost/context_inputs.hpp"
#include "shardwise/nn/kernels/functional_types.hpp"
#include "shardwise/nn/kernels/sequence_lengths.hpp"

namespace shardwise {

/// How each sequence of `sequence` tokens is cut over the `ranks` ranks of a context-parallel axis.
///
/// Balanced (the default; torchtitan's head-tail load balancer): the sequence is cut into 2 x ranks chunks and
/// rank r holds chunk r and chunk 2 x ranks - 1 - r, so that under a causal mask every rank scores about as many
/// query-key pairs as the others. Contiguous: rank r holds chunk r of `ranks`. When the chunks do not divide the
/// sequence, the first ones take a token more: any sequence of at least `ranks` tokens can be cut.
struct context_split {
  std::size_t sequence = 0;  ///< Tokens per sequence (the whole, before the cut).
  int ranks = 1;             ///< Ranks of the cp axis.
  bool balanced = true;      ///< Head-tail chunks (true) or one contiguous chunk per rank.

  /// The global positions of rank r's tokens, increasing: the order of its rows within each sequence.
  [[nodiscard]] std::vector<std::int64_t> positions(int rank) const {
    check(rank);
    std::vector<std::int64_t> out;
    for (int chunk : chunks_of(rank))
      for (std::size_t p = chunk_start(chunk); p < chunk_start(chunk + 1); ++p)
        out.push_back(static_cast<std::int64_t>(p));
    return out;
  }

  /// How many tokens of each sequence rank r holds.
  [[nodiscard]] std::size_t tokens(int rank) const {
    check(rank);
    return context_inputs{static_cast<std::size_t>(ranks), 0, sequence, balanced}.tokens(
        static_cast<std::size_t>(rank));
  }

  /// Rank r's rows of `whole`, rows of whole sequences ([batch x sequence, columns]): [batch x tokens(r), columns].
  template <class T>
  [[nodiscard]] nn::matrix<T> rows_of(nn::const_matrix_ref<T> whole, int rank) const {
    std::vector<std::int64_t> const mine = positions(rank);
    Eigen::Index const batch = whole_batch(whole.rows(), "rows_of");
    auto const n = static_cast<Eigen::Index>(mine.size()), s = static_cast<Eigen::Index>(sequence);
    nn::matrix<T> local(batch * n, whole.cols());
    for (Eigen::Index b = 0; b < batch; ++b)
      for (Eigen::Index i = 0; i < n; ++i) local.row(b * n + i) = whole.row(b * s + mine[static_cast<std::size_t>(i)]);
    return local;
  }

  /// Rank r's tokens of `whole`, whole sequences back to back (token ids, targets): batch x tokens(r) values, in
  /// the order of its rows.
  template <class T>
  [[nodiscard]] std::vector<T> tokens_of(std::vector<T> const& whole, int rank) const {
    std::vector<std::int64_t> const mine = positions(rank);
    auto const batch =
        static_cast<std::size_t>(whole_batch(static_cast<Eigen::Index>(whole.size()), "tokens_of", "tokens"));
    std::vector<T> local;
    local.reserve(batch * mine.size());
    for (std::size_t b = 0; b < batch; ++b)
      for (std::int64_t p : mine) local.push_back(whole[b * sequence + static_cast<std::size_t>(p)]);
    return local;
  }

  /// Writes rank r's rows `local` ([batch x tokens(r), columns]) into their places in `whole`.
  template <class T>
  void place_rows(nn::const_matrix_ref<T> local, int rank, nn::matrix_ref<T> whole) const {
    std::vector<std::int64_t> const mine = positions(rank);
    Eigen::Index const batch = whole_batch(whole.rows(), "place_rows");
    auto const n = static_cast<Eigen::Index>(mine.size()), s = static_cast<Eigen::Index>(sequence);
    if (local.rows() != batch * n || local.cols() != whole.cols())
      detail::fail("shardwise::context_split::place_rows: rank ", rank, "'s rows are ", local.rows(), "x", local.cols(),
                   " but ", batch * n, "x", whole.cols(), " are its place in the whole");
    for (Eigen::Index b = 0; b < batch; ++b)
      for (Eigen::Index i = 0; i < n; ++i) whole.row(b * s + mine[static_cast<std::size_t>(i)]) = local.row(b * n + i);
  }

  /// For sequences of packed documents: where the document of each of rank r's rows begins, as a global position
  /// in its sequence ([batch x tokens(r)], in the order of its rows). `documents` are the lengths of the documents
  /// packed back to back into `batch` sequences of `sequence` tokens, none crossing into the next sequence. Empty
  /// (no documents given, or whole sequences) when every row's document is its whole sequence.
  [[nodiscard]] std::vector<std::int64_t> document_starts(sequence_lengths const& documents, std::size_t batch,
                                                          int rank) const {
    if (documents.empty() || (documents.uniform() && documents.longest() == sequence)) return {};
    std::size_t const total = batch * sequence;
    documents.check(total, "shardwise::context_split::document_starts", sequence);
    std::vector<std::int64_t> start_of(total);
    documents.for_each(total, [&](std::size_t first, std::size_t length) {
      if (first / sequence != (first + length - 1) / sequence)
        detail::fail("shardwise::context_split::document_starts: a document of ", length, " tokens from token ", first,
                     " crosses from one sequence of ", sequence,
                     " tokens into the next; pack each sequence with whole documents (pad the last)");
      for (std::size_t i = first; i < first + length; ++i) start_of[i] = static_cast<std::int64_t>(first % sequence);
    });
    std::vector<std::int64_t> const mine = positions(rank);
    std::vector<std::int64_t> starts;
    starts.reserve(batch * mine.size());
    for (std::size_t b = 0; b < batch; ++b)
      for (std::int64_t p : mine) starts.push_back(start_of[b * sequence + static_cast<std::size_t>(p)]);
    return starts;
  }

  /// Throws unless the cut is possible: at least one token per rank.
  void check() const {
    if (ranks < 1 || sequence < static_cast<std::size_t>(ranks))
      detail::fail("shardwise::context_split: a sequence of ", sequence, " tokens over ", ranks,
                   " context-parallel ranks leaves a rank without tokens; use fewer cp ranks or longer sequences");
  }

 private:
  void check(int rank) const {
    check();
    if (rank < 0 || rank >= ranks)
      detail::fail("shardwise::context_split: rank ", rank, " is not one of the ", ranks, " context-parallel ranks");
  }
  [[nodiscard]] int chunk_count() const { return balanced ? 2 * ranks : ranks; }
  [[nodiscard]] std::size_t chunk_start(int chunk) const {
    auto const c = static_cast<std::size_t>(chunk), n = static_cast<std::size_t>(chunk_count());
    return c * (sequence / n) + std::min(c, sequence % n);
  }
  [[nodiscard]] std::vector<int> chunks_of(int rank) const {
    if (!balanced) return {rank};
    return {rank, 2 * ranks - 1 - rank};
  }
  [[nodiscard]] Eigen::Index whole_batch(Eigen::Index rows, char const* fn, char const* what = "rows") const {
    check();
    auto const s = static_cast<Eigen::Index>(sequence);
    if (rows % s != 0)
      detail::fail("shardwise::context_split::", fn, ": ", rows, " ", what, " are not whole sequences of ", sequence,
                   " tokens; give it ", what, " of whole sequences");
    return rows / s;
  }
};

}  // namespace shardwise

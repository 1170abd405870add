#pragma once
// Rotary position embedding (RoPE, Hugging Face's rotate-half convention) on every head of an attention's queries
// or keys: at each token's position within its sequence, at its global position under context parallelism, or at
// a key-value cache step's positions. Its shape-only form (sw::meta<T>) rotates nothing and holds nothing, as the
// real rotation holds nothing beyond a few rows of scratch.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "shardwise/context/context_parallel.hpp"
#include "shardwise/cost/meta_trace.hpp"
#include "shardwise/inference/kv_cache.hpp"
#include "shardwise/models/rope_scaling.hpp"
#include "shardwise/nn/kernels/functional.hpp"
#include "shardwise/nn/kernels/sequence_lengths.hpp"

namespace shardwise::models {

/// RoPE tables for heads of `head_dim` columns: cos and sin [positions, head_dim], the frequencies
/// theta^(-2i / head_dim) (as `scaling` changes them) repeated over the two halves of a head, times the
/// scaling's attention factor. The tables hold the positions rotated so far, not every position the model could
/// take: a Llama 3.2 config's 131,072 positions would be 64 MiB per layer at head_dim 64.
template <class T>
class rotary_embedding {
 public:
  /// The frequencies for positions up to `positions` (the longest the model takes); the tables are built as
  /// rotations reach positions.
  rotary_embedding(std::size_t positions, std::size_t head_dim, double theta, RopeScaling const& scaling = {})
      : head_dim_(head_dim),
        theta_(theta),
        scaling_(scaling),
        inverse_frequencies_(scaling.inverse_frequencies(head_dim, theta)),
        attention_factor_(scaling.rope_attention_factor()) {
    (void)positions;  // kept for the callers' sake: the tables grow to what is rotated
  }

  /// The positions the tables hold now.
  [[nodiscard]] std::size_t positions() const { return static_cast<std::size_t>(cos_.rows()); }

  /// Rotates every head of x [tokens, heads * head_dim] (inverse: by the transpose, for a backward): each row at
  /// its position in its sequence of `rows` (counted from 0 at the sequence's first row), or with a context, at
  /// this rank's global positions (from its document's start, when `rows` packs documents into the sequences).
  /// A dynamic (NTK) scaling rotates a sequence longer than its original length with the frequencies of its own
  /// length, as transformers rotates a call of that length.
  void rotate(nn::matrix<T>& x, sequence_lengths const& rows, context_parallel const* context, bool inverse = false);

  /// Rotates every head of a key-value cache step's rows, each entry's at its own positions; the tables grow to
  /// the cache's capacity (once) when it holds more positions than they do.
  void rotate(nn::matrix<T>& x, cache_step const& step);

 private:
  using scratch = Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  /// Grows the tables to `positions` rows when they hold fewer (the rows they hold are kept).
  void reach(std::size_t positions) {
    auto const s = static_cast<Eigen::Index>(positions), d = static_cast<Eigen::Index>(head_dim_);
    Eigen::Index const held = cos_.rows();
    if (s <= held) return;
    cos_.conservativeResize(s, d), sin_.conservativeResize(s, d);
    for (Eigen::Index p = held; p < s; ++p)
      for (Eigen::Index i = 0; i < d / 2; ++i) {
        double const angle = double(p) * inverse_frequencies_[static_cast<std::size_t>(i)];
        cos_(p, i) = cos_(p, i + d / 2) = static_cast<T>(std::cos(angle) * attention_factor_);
        sin_(p, i) = sin_(p, i + d / 2) = static_cast<T>(std::sin(angle) * attention_factor_);
      }
  }

  /// Under context parallelism: the position of each of x's rows (this rank's tokens of each sequence, sequence
  /// after sequence), from its sequence's start, or from its document's when `rows` packs documents into them.
  static std::vector<std::int64_t> positions_under(context_parallel const& context, Eigen::Index rows,
                                                   sequence_lengths const& documents) {
    auto const& mine = context.positions();
    auto const n = static_cast<Eigen::Index>(mine.size());
    if (n == 0 || rows % n != 0)
      shardwise::detail::fail("shardwise::models::rotary_embedding: ", rows,
                              " rows are not whole sequences of this cp rank's ", n, " tokens");
    auto const starts = context.document_starts(documents, static_cast<std::size_t>(rows / n));
    std::vector<std::int64_t> at(static_cast<std::size_t>(rows));
    for (std::size_t r = 0; r < at.size(); ++r) at[r] = mine[r % mine.size()] - (starts.empty() ? 0 : starts[r]);
    return at;
  }

  /// Under context parallelism: each row at its global position (in its document), a dynamic scaling at the
  /// whole sequence's length (packed documents under it are refused).
  void rotate_under(nn::matrix<T>& x, context_parallel const& context, sequence_lengths const& rows, bool inverse) {
    std::size_t const length = context.split().sequence;
    if (scaling_.rescales(length) && !context.documents(rows).empty())
      shardwise::detail::fail(
          "shardwise::models::rotary_embedding: a dynamic (NTK) rotary scaling on documents packed into sequences "
          "cut over cp is not built; give whole sequences, or pack without context parallelism");
    rotate_rows_at(x, positions_under(context, x.rows(), rows), length, inverse);
  }

  /// Rotates each row of x at its own position `at[row]`, runs of consecutive positions at a time, as rows of a
  /// sequence of `length` tokens.
  void rotate_rows_at(nn::matrix<T>& x, std::vector<std::int64_t> const& at, std::size_t length, bool inverse) {
    auto const n = static_cast<Eigen::Index>(at.size());
    if (!at.empty()) {
      if (*std::min_element(at.begin(), at.end()) < 0)
        shardwise::detail::fail("shardwise::models::rotary_embedding: a negative position; positions count from 0");
      if (!scaling_.rescales(length)) reach(static_cast<std::size_t>(*std::max_element(at.begin(), at.end())) + 1);
    }
    scratch first_half;
    auto const position = [&](Eigen::Index i) { return at[static_cast<std::size_t>(i)]; };
    for (Eigen::Index first = 0; first < n;) {
      Eigen::Index run = 1;
      while (first + run < n && position(first + run) == position(first) + run) ++run;
      rotate_run(x.middleRows(first, run), position(first), length, inverse, first_half);
      first += run;
    }
  }

  /// x <- x * cos + rotate_half(x) * sin on every head of consecutive rows at positions first, first + 1, ... of
  /// a sequence of `length` tokens; inverse applies the transpose (rotate_half's transpose is minus itself). From
  /// the tables, or for a dynamic scaling beyond its original length, from cos and sin of that length's
  /// frequencies at these positions.
  template <class Rows>
  void rotate_run(Rows&& x, Eigen::Index first, std::size_t length, bool inverse, scratch& first_half) const {
    if (!scaling_.rescales(length))
      return rotate_with(x, cos_.middleRows(first, x.rows()), sin_.middleRows(first, x.rows()), inverse, first_half);
    auto const d = static_cast<Eigen::Index>(head_dim_);
    std::vector<double> const inverse_frequencies = scaling_.inverse_frequencies(head_dim_, theta_, length);
    nn::matrix<T> cos(x.rows(), d), sin(x.rows(), d);
    for (Eigen::Index r = 0; r < x.rows(); ++r)
      for (Eigen::Index i = 0; i < d / 2; ++i) {
        double const angle = double(first + r) * inverse_frequencies[static_cast<std::size_t>(i)];
        cos(r, i) = cos(r, i + d / 2) = static_cast<T>(std::cos(angle) * attention_factor_);
        sin(r, i) = sin(r, i + d / 2) = static_cast<T>(std::sin(angle) * attention_factor_);
      }
    rotate_with(x, cos, sin, inverse, first_half);
  }

  /// x <- x * cos + rotate_half(x) * sin on every head (cos, sin [rows, head_dim]). Array expressions over each
  /// half of a head (vectorised); `first_half` is scratch space.
  template <class Rows, class Cos, class Sin>
  void rotate_with(Rows&& x, Cos const& cos_rows, Sin const& sin_rows, bool inverse, scratch& first_half) const {
    auto const d = static_cast<Eigen::Index>(head_dim_), half = d / 2;
    T const sign = inverse ? T(-1) : T(1);
    auto const cos = cos_rows.array(), sin = sin_rows.array();
    for (Eigen::Index h = 0; h < x.cols() / d; ++h) {
      auto a = x.middleCols(h * d, half).array();
      auto b = x.middleCols(h * d + half, half).array();
      first_half = a * cos.leftCols(half) - sign * b * sin.leftCols(half);
      b = b * cos.rightCols(half) + sign * a * sin.rightCols(half);  // a is still the input here
      a = first_half;
    }
  }

  nn::matrix<T> cos_, sin_;  // grown by the rotations: a model's rotations run on its rank's thread alone
  std::size_t head_dim_;
  double theta_;
  RopeScaling scaling_;
  std::vector<double> inverse_frequencies_;  // of each column pair
  double attention_factor_;                  // cos and sin are multiplied by it (yarn's; 1 for the others)
};

// The two rotations out of the class (not inline), so that SHARDWISE_SEPARATE_KERNELS compiles them once.
template <class T>
void rotary_embedding<T>::rotate(nn::matrix<T>& x, sequence_lengths const& rows, context_parallel const* context,
                                 bool inverse) {
  if (context) return rotate_under(x, *context, rows, inverse);
  reach(std::min(rows.longest(), static_cast<std::size_t>(x.rows())));
  scratch first_half;
  rows.for_each(static_cast<std::size_t>(x.rows()), [&](std::size_t first, std::size_t length) {
    rotate_run(x.middleRows(static_cast<Eigen::Index>(first), static_cast<Eigen::Index>(length)), 0, length, inverse,
               first_half);
  });
}

template <class T>
void rotary_embedding<T>::rotate(nn::matrix<T>& x, cache_step const& step) {
  reach(scaling_.type == rope_type::dynamic ? std::min(step.capacity, scaling_.original_max_positions) : step.capacity);
  Eigen::Index row = 0;
  scratch first_half;
  for (auto const& e : step.entries) {  // a dynamic scaling: each sequence at its own length so far
    auto const n = static_cast<Eigen::Index>(e.count);
    rotate_run(x.middleRows(row, n), static_cast<Eigen::Index>(e.start), e.start + e.count, false, first_half);
    row += n;
  }
}

/// The shape-only rotary embedding: rotation keeps every shape and holds nothing.
template <class T>
class rotary_embedding<meta<T>> {
 public:
  /// No tables.
  constexpr rotary_embedding(std::size_t, std::size_t, double, RopeScaling const& = {}) {}
  /// Nothing to rotate.
  constexpr void rotate(meta_matrix<T>&, sequence_lengths const&, context_parallel const*, bool = false) const {}
};

}  // namespace shardwise::models

// With SHARDWISE_SEPARATE_KERNELS defined, the rotations for float and double are compiled once, by the file that
// includes <shardwise/compile_kernels.hpp>, instead of in every file of a Llama.
#define SHARDWISE_DETAIL_ROTARY_KERNELS(prefix, T) prefix template class rotary_embedding<T>;
#if defined(SHARDWISE_SEPARATE_KERNELS) && !defined(SHARDWISE_DETAIL_COMPILING_KERNELS)
namespace shardwise::models {
SHARDWISE_DETAIL_ROTARY_KERNELS(extern, float)
SHARDWISE_DETAIL_ROTARY_KERNELS(extern, double)
}  // namespace shardwise::models
#endif

#pragma once
// Embedding: a lookup table [vocabulary, dim], unsharded, RowwiseParallel (vocabulary parallel: each rank
// holds a slice of the vocabulary, looks up the ids that fall in it, and the partial rows are summed) or
// ColwiseParallel (each rank holds a slice of the embedding columns). Ids are the same on every rank. The table
// is the weight of a Linear on one-hot ids, transposed, so a style cuts it and moves its output by the Linear's
// rules (nn/layers/linear_style.hpp): a cut by output features is a cut of the columns, a cut by input features one of
// the vocabulary, whose lookups are then partial sums.
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <tuple>
#include <type_traits>
#include <vector>

#include "shardwise/cost/cost.hpp"
#include "shardwise/nn/kernels/functional.hpp"
#include "shardwise/nn/layers/layer_common.hpp"
#include "shardwise/nn/layers/linear_style.hpp"
#include "shardwise/nn/layers/parameter.hpp"
#include "shardwise/nn/redistribute.hpp"
#include "shardwise/nn/shapes.hpp"
#include "shardwise/nn/training/deferred_weight_gradients.hpp"
#include "shardwise/placement/chunk.hpp"

namespace shardwise {

namespace detail {

/// An Embedding's state and code under style Rule (a sw::linear_style, read as the one-hot Linear's whose weight
/// is the table, transposed): what the typed Embedding of every path and plan with that style shares.
template <class T, class Rule>
class embedding_core : public layer_plumbing<T> {
  using plumbing = layer_plumbing<T>;
  using plumbing::frozen_;
  using plumbing::group_;
  using plumbing::lazy_;
  using plumbing::path_;
  static constexpr bool serial = std::is_same_v<Rule, unsharded_linear>;
  using layouts = linear_layouts<Rule>;  // of the one-hot Linear whose weight is the table
  using mover = typename Rule::mover;
  static constexpr bool cuts_vocabulary = layouts::cut_cols, cuts_columns = layouts::cut_rows;

 public:
  SHARDWISE_SAVED(ids_)
  using output_layout = typename layouts::out;  ///< The layout of its output on the tp axis.
  /// How the table (and its gradient) is cut over tp: Shard<0> (vocabulary), Shard<1> (columns) or Replicate.
  using grad_placement =
      std::conditional_t<cuts_columns, Shard<1>, std::conditional_t<cuts_vocabulary, Shard<0>, Replicate>>;
  using weight_grad_placement = grad_placement;  ///< The same, under the name Linear uses (for ties).
  using matrix = nn::matrix<T>;                  ///< Row-major matrix of T.

  /// Entries drawn from N(0, 1), as torch.nn.Embedding's; `path`: the layer's plan path (static storage).
  embedding_core(std::string_view path, std::size_t vocabulary, std::size_t dim, init seed);

  /// @{ Copies, moves and destruction, compiled with the core's other code (once, in shardwise::separate_kernels)
  /// rather than in every file that builds a model: a model's blocks copy and move their layers through them.
  embedding_core(embedding_core const&);
  embedding_core(embedding_core&&) noexcept;
  embedding_core& operator=(embedding_core const&);
  embedding_core& operator=(embedding_core&&) noexcept;
  ~embedding_core();
  /// @}

  /// @{ This rank's table (the whole of it before parallelize) and its gradient.
  matrix weight, weight_grad;
  /// @}

  /// The real vocabulary (without padding).
  [[nodiscard]] std::size_t vocabulary() const { return vocabulary_; }
  /// The embedding width.
  [[nodiscard]] std::size_t dim() const { return dim_; }
  /// The first id of this rank's vocabulary slice (0 unless RowwiseParallel).
  [[nodiscard]] std::int64_t vocab_start() const { return vocab_start_; }

  /// Sets the gradient to zero.
  void zero_grad() {  ///< A frozen table (sw::freeze) keeps no gradient.
    weight_grad.setZero(frozen_[0] ? 0 : weight.rows(), frozen_[0] ? 0 : weight.cols());
  }

  /// Pads the table with zero rows up to `rows` entries (before parallelize), as Megatron pads a vocabulary
  /// the tp size does not divide; ids never reach the padding.
  void pad_vocabulary(std::size_t rows);

  /// The table's cost (sw::cost) on one rank for s.tokens ids: its shard with its gradient, and the transfers its
  /// forward and backward run. `vocabulary`: the table's rows (padded to a multiple of the tp size under
  /// RowwiseParallel, as pad_vocabulary_for_tp does).
  static constexpr cost shardwise_cost(std::size_t vocabulary, std::size_t dim, cost_inputs const& s) {
    constexpr std::size_t e = sizeof(T);
    std::size_t const n = serial ? 1 : s.tp;
    std::size_t const rows = shard_extent(vocabulary, cuts_vocabulary, n), cols = shard_extent(dim, cuts_columns, n);
    cost c;
    c.parameter_bytes = c.gradient_bytes = rows * cols * e;
    c.activation_bytes = s.tokens * sizeof(std::int64_t);  // the ids, for the backward
    mover::template add_cost<typename layouts::product_out, output_layout>(c.forward, s.tokens, dim, e, s);
    mover::template add_cost<output_layout, typename layouts::product_out_grad>(c.backward, s.tokens, dim, e, s);
    return c;
  }

  /// This rank's table as the costs that walk a model's parameters see it (sw::parameter_cost), for a table of
  /// `shape` on s.tp ranks (cut as shardwise_cost cuts it).
  template <class Fn>
  static constexpr void shardwise_parameter_costs(embedding_shape const& shape, cost_inputs const& s, Fn&& fn) {
    std::size_t const n = serial ? 1 : s.tp;
    std::size_t const rows = shard_extent(shape.rows, cuts_vocabulary, n),
                      cols = shard_extent(shape.cols, cuts_columns, n);
    fn(parameter_cost{rows * cols, sizeof(T), false, 0, rows, !serial && (cuts_vocabulary || cuts_columns)});
  }

  /// Called by sw::parallelize: keeps this rank's slice and the group.
  template <class Mesh>
  void shardwise_parallelize(Mesh const& mesh) {
    group_ = nn::make_group<T>(mesh);
    keep_shard();
  }

  /// A lazily constructed table allocates this rank's shard (zeros, to be filled from a checkpoint).
  void shardwise_materialize();

  /// The rows of `ids` ([tokens, dim], in output_layout); ids outside the vocabulary are refused.
  Activation<T, output_layout> operator()(std::span<const std::int64_t> ids);

  /// Backward; the gradient given is in the output's layout or Partial<Sum> (reduced into it here first).
  template <class P>
  void backward(Activation<T, P> const& dy_given) {
    this->require_ready(!serial);
    backward_from(gradient_in<output_layout>(group_.get(), dy_given, "Embedding", path_));
  }

  /// The table with its gradient.
  auto parameters() {
    Parameter<matrix, grad_placement> w{&weight, &weight_grad, group_.get(), path_};
    w.real_rows = vocabulary_;  // rows past it are vocabulary padding
    w.frozen = &frozen_[0];
    return std::make_tuple(w);
  }

 protected:
  bool pad_for_tp_ = false;  // see Embedding::pad_vocabulary_for_tp

 private:
  std::size_t table_rows() const { return padded_ ? padded_ : vocabulary_; }
  void keep_shard();  // parallelize, once the group is known
  void backward_from(matrix const& dy_whole);

  std::size_t vocabulary_, dim_, local_rows_, local_cols_, padded_ = 0;  // local: this rank's shard
  std::int64_t vocab_start_ = 0;
  std::vector<std::int64_t> ids_;
};

/// The core an Embedding under Style derives from; a style that is not a linear_style gets the unsharded one, so
/// that the Embedding's own check is the error the user reads.
template <class T, class Style>
using embedding_core_for =
    embedding_core<T, std::conditional_t<linear_style<linear_style_t<Style>>, linear_style_t<Style>, unsharded_linear>>;

// The members that do the work, out of the class, so that SHARDWISE_SEPARATE_KERNELS can take the library's
// styles' cores from shardwise::separate_kernels (see the end of this file).
// Defaulted here, not in the class: an explicit instantiation declaration (SHARDWISE_SEPARATE_KERNELS) then
// keeps them out of the files that use the core.
template <class T, class Rule>
embedding_core<T, Rule>::embedding_core(embedding_core const&) = default;
template <class T, class Rule>
embedding_core<T, Rule>::embedding_core(embedding_core&&) noexcept = default;
template <class T, class Rule>
embedding_core<T, Rule>& embedding_core<T, Rule>::operator=(embedding_core const&) = default;
template <class T, class Rule>
embedding_core<T, Rule>& embedding_core<T, Rule>::operator=(embedding_core&&) noexcept = default;
template <class T, class Rule>
embedding_core<T, Rule>::~embedding_core() = default;

template <class T, class Rule>
embedding_core<T, Rule>::embedding_core(std::string_view path, std::size_t vocabulary, std::size_t dim, init seed)
    : plumbing("Embedding", path, seed.declares_only()),
      vocabulary_(vocabulary),
      dim_(dim),
      local_rows_(vocabulary),
      local_cols_(dim) {
  if (lazy_) return;  // sizes only: sw::materialize allocates this rank's shard
  weight.resize(static_cast<Eigen::Index>(vocabulary), static_cast<Eigen::Index>(dim));
  std::mt19937_64 rng(seed.seed());
  std::normal_distribution<double> normal(0.0, 1.0);
  for (Eigen::Index i = 0; i < weight.size(); ++i) weight.data()[i] = static_cast<T>(normal(rng));
  zero_grad();
}

template <class T, class Rule>
void embedding_core<T, Rule>::pad_vocabulary(std::size_t rows) {
  if (rows <= vocabulary_) return;
  padded_ = rows;
  if (lazy_) {
    local_rows_ = rows;
    return;
  }
  matrix padded = matrix::Zero(static_cast<Eigen::Index>(rows), weight.cols());
  padded.topRows(weight.rows()) = weight;
  weight = std::move(padded);
  zero_grad();
}

template <class T, class Rule>
void embedding_core<T, Rule>::keep_shard() {
  int const n = group_->size(), r = group_->rank();
  if constexpr (cuts_vocabulary) {
    if (pad_for_tp_) pad_vocabulary(padded_to_multiple(table_rows(), static_cast<std::size_t>(n)));
    require_divisible(style_name<Rule>, path_, "vocabulary entries", table_rows(), n, group_->axis(),
                      ", or pad the table with pad_vocabulary_for_tp()");
    auto const rows = static_cast<Eigen::Index>(shard_extent(table_rows(), true, static_cast<std::size_t>(n)));
    vocab_start_ = r * rows;
    local_rows_ = static_cast<std::size_t>(rows);
    if (lazy_) return;
    weight = matrix(weight.middleRows(r * rows, rows));
  } else if constexpr (cuts_columns) {
    require_divisible(style_name<Rule>, path_, "embedding columns", dim_, n, group_->axis());
    auto const cols = static_cast<Eigen::Index>(shard_extent(dim_, true, static_cast<std::size_t>(n)));
    local_cols_ = static_cast<std::size_t>(cols);
    if (lazy_) return;
    weight = matrix(weight.middleCols(r * cols, cols));
  }
  zero_grad();
}

template <class T, class Rule>
void embedding_core<T, Rule>::shardwise_materialize() {
  if (!lazy_) return;
  weight.setZero(static_cast<Eigen::Index>(local_rows_), static_cast<Eigen::Index>(local_cols_));
  lazy_ = false;  // gradients come on first use (backward, zero_grad, an optimizer): a load holds no more
}

template <class T, class Rule>
auto embedding_core<T, Rule>::operator()(std::span<const std::int64_t> ids) -> Activation<T, output_layout> {
  this->require_ready(!serial);
  for (auto id : ids)
    if (id < 0 || static_cast<std::size_t>(id) >= vocabulary_)
      fail("shardwise::Embedding at \"", path_, "\": id ", id, " is outside the vocabulary of ", vocabulary_);
  ids_.assign(ids.begin(), ids.end());
  matrix rows(static_cast<Eigen::Index>(ids.size()), weight.cols());
  nn::embedding_forward<T>(ids, weight, rows, vocab_start_);
  // Under a vocabulary cut each token's row lives on one rank and the others contributed zeros: a partial sum.
  if constexpr (!same_layout_v<typename layouts::product_out, output_layout>)
    rows = mover::template move<typename layouts::product_out, output_layout, T>(*group_, std::move(rows));
  return {std::move(rows)};
}

template <class T, class Rule>
void embedding_core<T, Rule>::backward_from(matrix const& dy_whole) {
  if (frozen_[0]) {  // sw::freeze: no scatter-add (and the layouts' conjugate moves carry nothing back)
    ids_.clear();
    return;
  }
  matrix const* dy = &dy_whole;
  matrix part;
  if constexpr (!same_layout_v<output_layout, typename layouts::product_out_grad>) {
    part = mover::template move<output_layout, typename layouts::product_out_grad, T>(*group_, *dy);  // conjugate
    dy = &part;
  }
  auto const scatter = [this](std::vector<std::int64_t> const& ids, matrix const& rows) {
    if (weight_grad.size() != weight.size()) zero_grad();  // a materialized table's first backward
    nn::embedding_backward<T>(ids, rows, weight_grad, vocab_start_);
  };
  if (auto* later = this->shardwise_weight_work()) {  // a pipeline's B: the scatter-add is all of W
    matrix rows = dy == &part ? std::move(part) : matrix(dy_whole);
    later->defer([scatter, ids = std::move(ids_), rows = std::move(rows)] { scatter(ids, rows); });
    ids_.clear();
    return;
  }
  scatter(ids_, *dy);
}

}  // namespace detail

/// A lookup table [vocabulary, dim] (torch.nn.Embedding), forward and backward: unsharded, RowwiseParallel
/// (a slice of the vocabulary per rank) or ColwiseParallel (a slice of the columns per rank).
template <class T, class Location = unplanned>
class Embedding : public detail::embedding_core_for<T, typename Location::style> {
  using core = detail::embedding_core_for<T, typename Location::style>;
  using Style = typename Location::style;
  using rule = detail::linear_style_t<Style>;  // NoParallel: the unsharded style
  using style_shown =
      decltype(detail::style_allowed<Location, linear_style<rule>>());  // before the message: see mesh.hpp
  static_assert(linear_style<rule>,
                "shardwise::Embedding: this style cannot shard an Embedding; use RowwiseParallel (vocabulary), "
                "ColwiseParallel (embedding columns), or leave it out of the plan");
  static_assert(detail::embedding_layouts_allowed<Style>);  // a library style's own rules, with their messages

 public:
  using shardwise_location = Location;                      ///< Its place in the plan (style, path, entries around it).
  using shardwise_core = detail::core_of<Embedding, core>;  ///< The class that holds its parameters.
  using style = Style;                                      ///< The parallel style the plan gives it.

  /// Entries drawn from N(0, 1), as torch.nn.Embedding's.
  constexpr Embedding(std::size_t vocabulary, std::size_t dim, init seed)
      : core(Location::path.view(), vocabulary, dim, seed) {}
  /// The same, from its shape.
  constexpr Embedding(embedding_shape const& shape, init seed) : Embedding(shape.rows, shape.cols, seed) {}

  /// Pads the table at parallelize, with zero rows no id reaches, up to a multiple of the tp size (under
  /// RowwiseParallel, a vocabulary the tp size does not divide), as Megatron does. Checkpoints store the real
  /// rows only; give the loss the real vocabulary as `classes`.
  constexpr Embedding& pad_vocabulary_for_tp() {
    this->pad_for_tp_ = true;
    return *this;
  }
};

}  // namespace shardwise

// With SHARDWISE_SEPARATE_KERNELS defined, the cores of the library's Embedding styles (unsharded, by vocabulary
// into a whole or a sequence-cut output, by columns) for float and double are declared here and compiled once,
// by the file that includes <shardwise/compile_kernels.hpp> (docs/build-time.md).
#define SHARDWISE_DETAIL_EMBEDDING_CORES(prefix, T)                                          \
  SHARDWISE_DETAIL_CORE(prefix, T, embedding_core<T, unsharded_linear>)                      \
  SHARDWISE_DETAIL_CORE(prefix, T, embedding_core<T, RowwiseParallel<Replicate, Replicate>>) \
  SHARDWISE_DETAIL_CORE(prefix, T, embedding_core<T, RowwiseParallel<Replicate, Shard<0>>>)  \
  SHARDWISE_DETAIL_CORE(prefix, T, embedding_core<T, ColwiseParallel<Replicate, Shard<-1>>>)
#if defined(SHARDWISE_SEPARATE_KERNELS) && !defined(SHARDWISE_DETAIL_COMPILING_KERNELS)
namespace shardwise::detail {
SHARDWISE_DETAIL_EMBEDDING_CORES(extern, float)
SHARDWISE_DETAIL_EMBEDDING_CORES(extern, double)
}  // namespace shardwise::detail
#endif

#include "shardwise/nn/layers/embedding_meta.hpp"  // the shape-only Embedding (element type sw::meta<T>)

#pragma once
// Cross-entropy on logits [tokens, vocabulary]: on replicated logits (every rank computes the same), or
// loss parallel on logits cut along the vocabulary (Shard<-1>, a ColwiseParallel output) without ever
// gathering them: two small all-reduces of per-token values (the max, then the sum of exponentials and the
// target logit). Either returns the mean over the call's valid targets, or, given the step's count
// (sw::count_valid_tokens), the call's share of the mean over every data rank's and microbatch's valid targets.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ranges>
#include <span>
#include <type_traits>
#include <utility>

#include "shardwise/core/show.hpp"
#include "shardwise/cost/cost.hpp"
#include "shardwise/mesh/collectives.hpp"
#include "shardwise/nn/activation.hpp"
#include "shardwise/nn/group.hpp"
#include "shardwise/nn/kernels/functional.hpp"
#include "shardwise/nn/meta.hpp"

namespace shardwise {

/// What cross_entropy returns: the loss and its gradient with respect to the logits.
template <class T, class P>
struct LossAndGradient {
  T loss;                    ///< Mean over the targets that are not ignored, the same on every rank.
  Activation<T, P> dlogits;  ///< Gradient of that mean, in the logits' layout.
};

/// What a loss is normalised by when one optimizer step's tokens are spread over data-parallel (and cp) ranks and
/// microbatches: their number of valid targets, all of them (sw::count_valid_tokens). Each call's loss is then its
/// tokens' sum over `global` — the shares add up to the mean over every valid token of the step — and its gradient
/// that share's times `data_ranks`, so that the optimizer's average over the data ranks makes the gradients' sum the
/// gradient of that mean: the full batch's step on one rank, whatever the masks.
struct valid_tokens {
  double global = 0;      ///< Valid targets over every data rank and microbatch of the step.
  double data_ranks = 1;  ///< Ranks the optimizer averages the gradients over.
};

/// Counts the valid targets (not `ignore_index`) of every microbatch this rank trains on in one optimizer step and
/// sums them over `data`, the 1-D mesh the optimizer averages gradients over (dp; under context parallelism the
/// data axis holding cp; under FSDP its dp mesh): one all-reduce of one number a step. `microbatches`: a range of
/// this rank's target lists (each a range of std::int64_t); under cp, this rank's tokens of them.
template <class Mesh, std::ranges::input_range Microbatches>
  requires std::ranges::input_range<std::ranges::range_value_t<Microbatches>>
[[nodiscard]] valid_tokens count_valid_tokens(Mesh const& data, Microbatches const& microbatches,
                                              std::int64_t ignore_index = -100) {
  // [valid targets, ranks given no microbatch], summed in one call so that every rank refuses alike.
  Eigen::VectorXd counts = Eigen::VectorXd::Zero(2);
  bool any = false;
  for (auto const& targets : microbatches) {
    any = true;
    for (std::int64_t t : targets) counts(0) += t == ignore_index ? 0 : 1;
  }
  counts(1) = any ? 0 : 1;
  all_reduce(data, counts, Sum{});
  if (counts(1) > 0)
    detail::fail("shardwise::count_valid_tokens: ", counts(1),
                 " data rank(s) gave no microbatch; a step needs at "
                 "least one microbatch on every rank (gradient accumulation steps of 0 train nothing)");
  return {counts(0), static_cast<double>(data.size(0))};
}

/// As above, for one microbatch a step.
template <class Mesh>
[[nodiscard]] valid_tokens count_valid_tokens(Mesh const& data, std::span<const std::int64_t> targets,
                                              std::int64_t ignore_index = -100) {
  return count_valid_tokens(data, std::span(&targets, 1), ignore_index);
}

namespace detail {
template <class P>
struct loss_parallel_needs_shard_last_got;  // incomplete on purpose: shows the logits' layout
}  // namespace detail

/// Cross-entropy of replicated logits (PyTorch's F.cross_entropy, reduction "mean", ignore_index -100).
/// `classes` (optional): only the first columns are classes; the rest is vocabulary padding, left out of the
/// softmax and given zero gradient.
template <class T>
LossAndGradient<T, Replicate> cross_entropy(Activation<T, Replicate> const& logits,
                                            std::span<const std::int64_t> targets, std::int64_t ignore_index = -100,
                                            std::int64_t classes = -1, valid_tokens const& tokens = {}) {
  Eigen::Index const valid = classes < 0 ? logits.local.cols() : std::min<Eigen::Index>(classes, logits.local.cols());
  // The gradient is written in place: no zeroed matrix first, no copy of the classes' columns after.
  LossAndGradient<T, Replicate> result{T(0), {nn::matrix<T>(logits.local.rows(), logits.local.cols())}};
  result.dlogits.local.rightCols(logits.local.cols() - valid).setZero();
  result.loss =
      nn::cross_entropy_forward_backward<T>(logits.local.leftCols(valid), targets, result.dlogits.local.leftCols(valid),
                                            ignore_index, tokens.global, tokens.data_ranks);
  return result;
}

/// As above, on logits given as a temporary: the gradient is written into their storage (each row read before it
/// is overwritten), so the loss allocates no logits-sized matrix.
template <class T>
LossAndGradient<T, Replicate> cross_entropy(Activation<T, Replicate>&& logits, std::span<const std::int64_t> targets,
                                            std::int64_t ignore_index = -100, std::int64_t classes = -1,
                                            valid_tokens const& tokens = {}) {
  Eigen::Index const valid = classes < 0 ? logits.local.cols() : std::min<Eigen::Index>(classes, logits.local.cols());
  LossAndGradient<T, Replicate> result{T(0), {std::move(logits.local)}};
  auto& gradient = result.dlogits.local;
  try {
    result.loss = nn::cross_entropy_forward_backward<T>(gradient.leftCols(valid), targets, gradient.leftCols(valid),
                                                        ignore_index, tokens.global, tokens.data_ranks);
  } catch (...) {  // the kernel checks every target before it writes: the caller's logits go back untouched
    logits.local = std::move(gradient);
    throw;
  }
  gradient.rightCols(gradient.cols() - valid).setZero();
  return result;
}

namespace detail {
/// The targets against this rank's logits: one per row, each a class or ignore_index. Every rank holds the same
/// targets, so every rank raises alike, before any collective (and before a temporary's logits are taken).
template <class Comm>
void check_loss_parallel_targets(Comm const& comm, Eigen::Index rows, Eigen::Index cols,
                                 std::span<const std::int64_t> targets, std::int64_t ignore_index,
                                 std::int64_t classes) {
  if (static_cast<std::size_t>(rows) != targets.size())
    detail::fail("shardwise::loss_parallel: ", rows, " rows of logits but ", targets.size(),
                 " targets; give one target per token row");
  std::int64_t const vocabulary = classes >= 0 ? classes : static_cast<std::int64_t>(cols) * comm.size();
  for (std::int64_t t : targets)
    if (t != ignore_index && (t < 0 || t >= vocabulary))
      detail::fail("shardwise::loss_parallel: target ", t, " is outside the vocabulary [0, ", vocabulary,
                   ") and is not ignore_index (", ignore_index, "); check the token ids");
}

template <class Mesh, class P>
constexpr void check_loss_parallel_arguments() {
  constexpr bool sharded_vocab = std::is_same_v<detail::normalize_2d_t<P>, Shard<1>>;
  static_assert(sharded_vocab,
                "shardwise::loss_parallel: expects logits cut along the vocabulary (Shard<-1>, the "
                "output of a ColwiseParallel with its default output_layouts); a RowwiseParallel or "
                "replicated output needs sw::cross_entropy instead");
  if constexpr (!sharded_vocab) {
    using offending_layout [[maybe_unused]] =
        decltype(detail::show_incomplete<detail::loss_parallel_needs_shard_last_got<P>>());
  }
  static_assert(Mesh::ndim == 1, "shardwise::loss_parallel: pass the tensor-parallel axis, sw::submesh<\"tp\">(mesh)");
}

/// Loss parallel on this rank's logits `local`, writing the gradient into `gradient` ([rows, cols], its values
/// not read), which may own the very storage `local` views: each row's target logit and exponentials are read
/// before the row is overwritten.
template <class T, class P, class Comm>
LossAndGradient<T, P> loss_parallel_into(Comm const& comm, nn::const_matrix_ref<T> local, nn::matrix<T> gradient,
                                         std::span<const std::int64_t> targets, std::int64_t ignore_index,
                                         std::int64_t classes, valid_tokens const& tokens) {
  Eigen::Index const rows = local.rows(), cols = local.cols();
  std::int64_t const vocab_start = static_cast<std::int64_t>(comm.rank()) * cols;
  // Columns at or past `classes` are vocabulary padding: out of the softmax, zero gradient.
  Eigen::Index const valid =
      classes < 0 ? cols : static_cast<Eigen::Index>(std::clamp<std::int64_t>(classes - vocab_start, 0, cols));

  nn::vector<T> max(rows);
  for (Eigen::Index i = 0; i < rows; ++i) max(i) = cols ? local.row(i).maxCoeff() : -std::numeric_limits<T>::infinity();
  Eigen::Map<nn::vector<T>> max_view(max.data(), rows);
  detail::all_reduce_on(comm, max_view, detail::op_kind::max);

  // exp(logit - max) row by row (a row is contiguous, so Eigen vectorises the exponential), written where the
  // gradient will be and scaled into it in place.
  nn::vector<T> sums(2 * rows);  // [sum of exp, target logit] per token, reduced in one call
  for (Eigen::Index i = 0; i < rows; ++i) {
    std::int64_t const t = targets[static_cast<std::size_t>(i)] - vocab_start;
    sums(rows + i) = (t >= 0 && t < valid) ? local(i, t) : T(0);
    auto row = gradient.row(i);
    row.leftCols(valid).array() = (local.row(i).leftCols(valid).array() - max(i)).exp();
    row.rightCols(cols - valid).setZero();
    sums(i) = row.sum();
  }
  Eigen::Map<nn::vector<T>> sums_view(sums.data(), 2 * rows);
  detail::all_reduce_on(comm, sums_view, detail::op_kind::sum);

  std::size_t counted = 0;
  for (auto t : targets) counted += t == ignore_index ? 0 : 1;
  detail::check_within_step(counted, tokens.global, "shardwise::loss_parallel");
  LossAndGradient<T, P> result{T(0), {std::move(gradient)}};
  if (counted == 0) {  // as nn::cross_entropy_forward_backward: zero loss and gradient
    result.dlogits.local.setZero();
    return result;
  }
  // The mean over this call's targets, or (tokens) a share of the step's mean with its gradient times data_ranks.
  T const share = tokens.global > 0 ? static_cast<T>(1.0 / tokens.global) : T(1) / static_cast<T>(counted);
  T const scale = tokens.global > 0 ? static_cast<T>(tokens.data_ranks / tokens.global) : share;
  for (Eigen::Index i = 0; i < rows; ++i) {
    std::int64_t const target = targets[static_cast<std::size_t>(i)];
    if (target == ignore_index) {
      result.dlogits.local.row(i).setZero();
      continue;
    }
    result.loss += std::log(sums(i)) + max(i) - sums(rows + i);
    result.dlogits.local.row(i) *= scale / sums(i);
    std::int64_t const t = target - vocab_start;
    if (t >= 0 && t < cols) result.dlogits.local(i, t) -= scale;
  }
  result.loss *= share;
  return result;
}
}  // namespace detail

/// Loss parallel: logits cut along the vocabulary over the 1-D mesh `tp` (ColwiseParallel's default output).
template <class Mesh, class T, class P>
LossAndGradient<T, P> loss_parallel(Mesh const& tp, Activation<T, P> const& logits,
                                    std::span<const std::int64_t> targets, std::int64_t ignore_index = -100,
                                    std::int64_t classes = -1, valid_tokens const& tokens = {}) {
  detail::check_loss_parallel_arguments<Mesh, P>();
  detail::check_loss_parallel_targets(tp.comm(0), logits.local.rows(), logits.local.cols(), targets, ignore_index,
                                      classes);
  return detail::loss_parallel_into<T, P>(tp.comm(0), logits.local,
                                          nn::matrix<T>(logits.local.rows(), logits.local.cols()), targets,
                                          ignore_index, classes, tokens);
}

/// As above, on logits given as a temporary: the gradient is written into their storage, so the loss allocates
/// no logits-sized matrix (pass `model.forward(ids)` straight in).
template <class Mesh, class T, class P>
LossAndGradient<T, P> loss_parallel(Mesh const& tp, Activation<T, P>&& logits, std::span<const std::int64_t> targets,
                                    std::int64_t ignore_index = -100, std::int64_t classes = -1,
                                    valid_tokens const& tokens = {}) {
  detail::check_loss_parallel_arguments<Mesh, P>();
  detail::check_loss_parallel_targets(tp.comm(0), logits.local.rows(), logits.local.cols(), targets, ignore_index,
                                      classes);
  nn::matrix<T> storage = std::move(logits.local);
  nn::const_matrix_ref<T> const local(storage);  // stays valid: moving a matrix moves its buffer, not the data
  return detail::loss_parallel_into<T, P>(tp.comm(0), local, std::move(storage), targets, ignore_index, classes,
                                          tokens);
}

/// The cost (sw::cost) of sw::cross_entropy on `rows` rows of logits in layout P: loss parallel (Shard<-1>)
/// all-reduces the rows' maxima, then their sums and target logits in one call; on replicated logits nothing
/// moves.
template <class T, class P>
constexpr cost cross_entropy_cost(std::size_t rows, cost_inputs const& s) {
  cost c;
  if constexpr (std::is_same_v<detail::normalize_2d_t<P>, Shard<1>>)
    c.forward.add(transfer_kind::all_reduce, s.tp_axis, rows * sizeof(T))
        .add(transfer_kind::all_reduce, s.tp_axis, 2 * rows * sizeof(T));
  return c;
}

/// sw::cross_entropy on shapes (sw::derived_cost): records cross_entropy_cost's transfers where the code calls it;
/// the gradient has the logits' shape, in a new matrix as the real one's.
template <class Mesh, class T, class P>
constexpr LossAndGradient<meta<T>, P> cross_entropy(Mesh const&, Activation<meta<T>, P> const& logits, meta_ids,
                                                    std::int64_t = -100, std::int64_t = -1) {
  meta_trace& trace = *logits.local.trace();
  trace.add(cross_entropy_cost<T, P>(static_cast<std::size_t>(logits.local.rows()), trace.inputs).forward);
  return {meta<T>{}, {logits.local.like(logits.local.rows(), logits.local.cols())}};
}
/// As above, on logits given as a temporary: the gradient takes their storage, as the real one's.
template <class Mesh, class T, class P>
constexpr LossAndGradient<meta<T>, P> cross_entropy(Mesh const&, Activation<meta<T>, P>&& logits, meta_ids,
                                                    std::int64_t = -100, std::int64_t = -1) {
  meta_trace& trace = *logits.local.trace();
  trace.add(cross_entropy_cost<T, P>(static_cast<std::size_t>(logits.local.rows()), trace.inputs).forward);
  return {meta<T>{}, {std::move(logits.local)}};
}

/// Cross-entropy matching the logits' layout: loss parallel on logits cut along the vocabulary (Shard<-1>, over
/// the 1-D mesh `tp`), plain cross-entropy on replicated ones. `classes`: the real vocabulary, when the logits
/// carry vocabulary padding (pad_outputs_for_tp); -1: every column is a class.
template <class Mesh, class T, class P>
LossAndGradient<T, P> cross_entropy(Mesh const& tp, Activation<T, P> const& logits,
                                    std::span<const std::int64_t> targets, std::int64_t ignore_index = -100,
                                    std::int64_t classes = -1) {
  if constexpr (std::is_same_v<P, Replicate>)
    return cross_entropy(logits, targets, ignore_index, classes);
  else
    return loss_parallel(tp, logits, targets, ignore_index, classes);
}

/// As above, on logits given as a temporary: the gradient is written into their storage.
template <class Mesh, class T, class P>
LossAndGradient<T, P> cross_entropy(Mesh const& tp, Activation<T, P>&& logits, std::span<const std::int64_t> targets,
                                    std::int64_t ignore_index = -100, std::int64_t classes = -1) {
  if constexpr (std::is_same_v<P, Replicate>)
    return cross_entropy(std::move(logits), targets, ignore_index, classes);
  else
    return loss_parallel(tp, std::move(logits), targets, ignore_index, classes);
}

/// Cross-entropy normalised over the step's valid tokens (sw::count_valid_tokens): `loss` is this call's share of
/// the mean over every valid target of the step, on every data rank and microbatch, and `dlogits` its gradient times
/// tokens.data_ranks, ready for a backward whose gradients accumulate over the microbatches and are averaged over
/// the data ranks by the optimizer. Otherwise as above (loss parallel or plain, by the logits' layout).
template <class Mesh, class T, class P>
LossAndGradient<T, P> cross_entropy(Mesh const& tp, Activation<T, P> const& logits,
                                    std::span<const std::int64_t> targets, valid_tokens const& tokens,
                                    std::int64_t ignore_index = -100, std::int64_t classes = -1) {
  if constexpr (std::is_same_v<P, Replicate>)
    return cross_entropy(logits, targets, ignore_index, classes, tokens);
  else
    return loss_parallel(tp, logits, targets, ignore_index, classes, tokens);
}

/// As above, on logits given as a temporary: the gradient is written into their storage.
template <class Mesh, class T, class P>
LossAndGradient<T, P> cross_entropy(Mesh const& tp, Activation<T, P>&& logits, std::span<const std::int64_t> targets,
                                    valid_tokens const& tokens, std::int64_t ignore_index = -100,
                                    std::int64_t classes = -1) {
  if constexpr (std::is_same_v<P, Replicate>)
    return cross_entropy(std::move(logits), targets, ignore_index, classes, tokens);
  else
    return loss_parallel(tp, std::move(logits), targets, ignore_index, classes, tokens);
}

}  // namespace shardwise

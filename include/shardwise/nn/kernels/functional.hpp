#pragma once
// Unsharded numerical kernels of transformer layers, forward and backward, on row-major Eigen matrices
// [rows = tokens, cols = features]. Sharded layers call them on their local slices, so every output goes into a
// caller-provided buffer of the right shape (an Eigen::Ref: a block of a larger matrix works without a copy) and
// nothing is resized.
//
// For every function here:
//  - T is float or double (any std::floating_point) and is NOT deduced (an Eigen::Ref parameter does not deduce
//    from a Matrix or a block): call as linear_forward<float>(x, w, b, y).
//  - Gradients of parameters (dweight, dbias, dgamma, dbeta, dtable) are ACCUMULATED (+=), as PyTorch accumulates
//    .grad over backward calls: zero them once per optimizer step. Gradients of inputs (dx, dlogits) are assigned.
//  - "None" for an optional argument is std::nullopt. Pass the matrix or block straight to the call: a
//    std::optional<const_..._ref> whose source had to be copied (not row-major, strided) must not be copied itself,
//    because Eigen::Ref's copy points into the original's copy.
//  - Shapes are checked at run time (O(1)); a mismatch throws shardwise::error naming the argument.
//  - Inputs that are not row-major with contiguous rows are copied by Eigen::Ref<const ...>; keep the hot path
//    row-major.
// Include this header for all of them; nn/kernels/functional_elementwise.hpp (relu, silu, gelu) and
// nn/kernels/functional_types.hpp (the aliases) are its parts.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>

#include "shardwise/nn/kernels/blas_check.hpp"
#include "shardwise/nn/kernels/few_rows.hpp"
#include "shardwise/nn/kernels/functional_elementwise.hpp"
#include "shardwise/nn/kernels/functional_types.hpp"

namespace shardwise::detail {
/// The row of a table holding ids [vocab_start, vocab_start + rows), or -1 when id is elsewhere. Compares before
/// subtracting, so that no id (negative, huge) can overflow.
constexpr std::int64_t nn_local_row(std::int64_t id, std::int64_t vocab_start, std::int64_t rows) {
  return id >= vocab_start && id - vocab_start < rows ? id - vocab_start : -1;
}

inline void nn_check_embedding(char const* fn, std::size_t ids, std::int64_t vocab_start) {
  if (vocab_start < 0) fail("shardwise::nn::", fn, ": vocab_start is ", vocab_start, "; it must be >= 0");
  if (ids > static_cast<std::size_t>(Eigen::NumTraits<Eigen::Index>::highest()))
    fail("shardwise::nn::", fn, ": too many ids");
}
inline void nn_check_norm(char const* fn, Eigen::Index features) {
  if (features == 0) fail("shardwise::nn::", fn, ": x has no features (0 columns); normalize at least one");
}
/// A loss call's valid targets are a part of the step's (sw::count_valid_tokens); more is a count of other batches.
template <class... Who>
void check_within_step(std::size_t counted, double step_valid, Who const&... who) {
  if (step_valid > 0 && static_cast<double>(counted) > step_valid)
    fail(who..., ": ", counted, " valid targets here but ", step_valid,
         " in the whole step; count every microbatch's targets with sw::count_valid_tokens");
}
}  // namespace shardwise::detail

namespace shardwise::nn {

// ---------------------------------------------------------------------------------------------------------- linear

/// y = x W^T + b, as torch.nn.Linear. x [N, in], weight [out, in] (PyTorch layout), bias [out] or std::nullopt,
/// y [N, out]. y must not alias x or weight.
template <std::floating_point T>
void linear_forward(const_matrix_ref<T> x, const_matrix_ref<T> weight, std::optional<const_vector_ref<T>> bias,
                    matrix_ref<T> y) {
  constexpr char const* fn = "linear_forward";
  if constexpr (detail::eigen_uses_blas) detail::check_blas_kernels_once();
  detail::nn_check_shape(fn, "weight [out, in]", weight, weight.rows(), x.cols());
  detail::nn_check_shape(fn, "y [N, out]", y, x.rows(), weight.rows());
  if (bias) {
    detail::nn_check_size(fn, "bias [out]", *bias, weight.rows());
    // Start y at b so the GEMM adds into it (beta = 1) instead of a second pass over y.
    y.rowwise() = bias->transpose();
  }
  // A few rows (decoding a batch of sequences) against a weight of 256 rows or more: each weight row read once from
  // memory (nn/kernels/few_rows.hpp) where the target has the vectors for it. Else, against a large weight, a block
  // of weight rows at a time, which the GEMM packs in cache, rather than the whole weight packed through memory. One
  // row is a matrix-vector product either way.
  if constexpr (detail::few_rows_supported) {
    if (x.rows() > 1 && x.rows() <= detail::few_rows_most && weight.rows() >= 256) {
      detail::few_rows_product<T>(x.data(), x.outerStride(), static_cast<int>(x.rows()), weight.data(),
                                  weight.outerStride(), weight.rows(), weight.cols(), y.data(), y.outerStride(),
                                  bias.has_value());
      return;
    }
  }
  Eigen::Index const block = x.rows() > 1 && x.rows() <= 16 && weight.rows() >= 1024 ? 128 : weight.rows();
  for (Eigen::Index first = 0; first < weight.rows(); first += block) {
    Eigen::Index const n = std::min(block, weight.rows() - first);
    if (bias)
      y.middleCols(first, n).noalias() += x * weight.middleRows(first, n).transpose();
    else
      y.middleCols(first, n).noalias() = x * weight.middleRows(first, n).transpose();
  }
}

/// The input-gradient half of linear_backward (a pipeline's B): dx [N, in] = dy [N, out] W (assigned).
template <std::floating_point T>
void linear_backward_input(const_matrix_ref<T> weight, const_matrix_ref<T> dy, matrix_ref<T> dx) {
  constexpr char const* fn = "linear_backward_input";
  detail::nn_check_shape(fn, "dy [N, out]", dy, dy.rows(), weight.rows());
  detail::nn_check_shape(fn, "dx [N, in]", dx, dy.rows(), weight.cols());
  dx.noalias() = dy * weight;
}

/// The weight-gradient half of linear_backward (a pipeline's W): dweight += dy^T x, dbias += column sums of dy
/// (std::nullopt when the layer has no bias). The two halves run the very statements linear_backward runs.
template <std::floating_point T>
void linear_backward_weight(const_matrix_ref<T> x, const_matrix_ref<T> dy, matrix_ref<T> dweight,
                            std::optional<vector_ref<T>> dbias) {
  constexpr char const* fn = "linear_backward_weight";
  detail::nn_check_shape(fn, "dy [N, out]", dy, x.rows(), dweight.rows());
  detail::nn_check_shape(fn, "dweight [out, in]", dweight, dweight.rows(), x.cols());
  dweight.noalias() += dy.transpose() * x;
  if (dbias) {
    detail::nn_check_size(fn, "dbias [out]", *dbias, dweight.rows());
    *dbias += dy.colwise().sum().transpose();
  }
}

/// Backward of linear_forward, given dy [N, out]: dx = dy W (assigned; std::nullopt skips it, e.g. for a first
/// layer whose input needs no gradient), dweight += dy^T x, dbias += column sums of dy (std::nullopt when the
/// layer has no bias). Parameter gradients accumulate, as PyTorch's .grad does.
template <std::floating_point T>
void linear_backward(const_matrix_ref<T> x, const_matrix_ref<T> weight, const_matrix_ref<T> dy,
                     std::optional<matrix_ref<T>> dx, matrix_ref<T> dweight, std::optional<vector_ref<T>> dbias) {
  detail::nn_check_shape("linear_backward", "weight [out, in]", weight, weight.rows(), x.cols());
  if (dx) linear_backward_input<T>(weight, dy, *dx);
  linear_backward_weight<T>(x, dy, dweight, dbias);
}

// ------------------------------------------------------------------------------------------------------- embedding

/// out row i = table row (ids[i] - vocab_start) when the id falls in this table's slice [vocab_start,
/// vocab_start + table.rows()), else zeros: a vocabulary-parallel embedding sums the partial outputs of all
/// slices. ids [N], table [rows, D], out [N, D]. Ids outside the full vocabulary are the caller's to reject; any
/// id, negative included, is safe here (it gives a zero row).
template <std::floating_point T>
void embedding_forward(std::span<const std::int64_t> ids, const_matrix_ref<T> table, matrix_ref<T> out,
                       std::int64_t vocab_start = 0) {
  constexpr char const* fn = "embedding_forward";
  detail::nn_check_embedding(fn, ids.size(), vocab_start);
  auto const n = static_cast<Eigen::Index>(ids.size());
  detail::nn_check_shape(fn, "out [N, D]", out, n, table.cols());
  for (Eigen::Index i = 0; i < n; ++i) {
    std::int64_t const row = detail::nn_local_row(ids[static_cast<std::size_t>(i)], vocab_start, table.rows());
    if (row < 0)
      out.row(i).setZero();
    else
      out.row(i) = table.row(row);
  }
}

/// Backward of embedding_forward: dtable row (ids[i] - vocab_start) += dout row i, for ids in this slice only;
/// repeated ids add up. dout [N, D], dtable [rows, D]. dtable accumulates, as PyTorch's .grad does.
template <std::floating_point T>
void embedding_backward(std::span<const std::int64_t> ids, const_matrix_ref<T> dout, matrix_ref<T> dtable,
                        std::int64_t vocab_start = 0) {
  constexpr char const* fn = "embedding_backward";
  detail::nn_check_embedding(fn, ids.size(), vocab_start);
  auto const n = static_cast<Eigen::Index>(ids.size());
  detail::nn_check_shape(fn, "dout [N, D]", dout, n, dtable.cols());
  for (Eigen::Index i = 0; i < n; ++i) {
    std::int64_t const row = detail::nn_local_row(ids[static_cast<std::size_t>(i)], vocab_start, dtable.rows());
    if (row >= 0) dtable.row(row) += dout.row(i);
  }
}

// ------------------------------------------------------------------------------------------------------ layer norm

/// y = (x - mean) * rstd * gamma + beta per row, rstd = 1 / sqrt(biased variance + eps), as torch.nn.LayerNorm
/// over the last dimension. x, y [N, D]; gamma, beta [D]; mean and rstd [N] are saved for the backward.
/// y may be the same memory as x.
template <std::floating_point T>
void layer_norm_forward(const_matrix_ref<T> x, const_vector_ref<T> gamma, const_vector_ref<T> beta, T eps,
                        matrix_ref<T> y, vector_ref<T> mean, vector_ref<T> rstd) {
  constexpr char const* fn = "layer_norm_forward";
  Eigen::Index const n = x.rows(), d = x.cols();
  detail::nn_check_norm(fn, d);
  detail::nn_check_size(fn, "gamma [D]", gamma, d);
  detail::nn_check_size(fn, "beta [D]", beta, d);
  detail::nn_check_shape(fn, "y [N, D]", y, n, d);
  detail::nn_check_size(fn, "mean [N]", mean, n);
  detail::nn_check_size(fn, "rstd [N]", rstd, n);
  for (Eigen::Index i = 0; i < n; ++i) {
    auto const xi = x.row(i).array();
    T const mu = xi.mean();
    // Two passes (mean, then squares about it): the one-pass E[x^2] - E[x]^2 cancels badly when |mean| >> std.
    T const r = T(1) / std::sqrt((xi - mu).square().mean() + eps);
    mean(i) = mu;
    rstd(i) = r;
    y.row(i).array() = (xi - mu) * r * gamma.transpose().array() + beta.transpose().array();
  }
}

/// The input-gradient half of layer_norm_backward (a pipeline's B): dx alone, by the same expressions.
template <std::floating_point T>
void layer_norm_backward_input(const_matrix_ref<T> x, const_vector_ref<T> gamma, const_matrix_ref<T> dy,
                               const_vector_ref<T> mean, const_vector_ref<T> rstd, matrix_ref<T> dx) {
  constexpr char const* fn = "layer_norm_backward_input";
  Eigen::Index const n = x.rows(), d = x.cols();
  detail::nn_check_norm(fn, d);
  detail::nn_check_size(fn, "gamma [D]", gamma, d);
  detail::nn_check_shape(fn, "dy [N, D]", dy, n, d);
  detail::nn_check_size(fn, "mean [N]", mean, n);
  detail::nn_check_size(fn, "rstd [N]", rstd, n);
  detail::nn_check_shape(fn, "dx [N, D]", dx, n, d);
  for (Eigen::Index i = 0; i < n; ++i) {
    auto const xhat = (x.row(i).array() - mean(i)) * rstd(i);
    auto const g = dy.row(i).array() * gamma.transpose().array();
    T const g_mean = g.mean(), gx_mean = (g * xhat).mean();
    dx.row(i).array() = (g - g_mean - xhat * gx_mean) * rstd(i);
  }
}

/// The weight-gradient half of layer_norm_backward (a pipeline's W): dgamma and dbeta accumulated row by row, by
/// the same expressions in the same order.
template <std::floating_point T>
void layer_norm_backward_weight(const_matrix_ref<T> x, const_matrix_ref<T> dy, const_vector_ref<T> mean,
                                const_vector_ref<T> rstd, vector_ref<T> dgamma, vector_ref<T> dbeta) {
  constexpr char const* fn = "layer_norm_backward_weight";
  Eigen::Index const n = x.rows(), d = x.cols();
  detail::nn_check_shape(fn, "dy [N, D]", dy, n, d);
  detail::nn_check_size(fn, "mean [N]", mean, n);
  detail::nn_check_size(fn, "rstd [N]", rstd, n);
  detail::nn_check_size(fn, "dgamma [D]", dgamma, d);
  detail::nn_check_size(fn, "dbeta [D]", dbeta, d);
  for (Eigen::Index i = 0; i < n; ++i) {
    auto const xhat = (x.row(i).array() - mean(i)) * rstd(i);
    auto const dyi = dy.row(i).array();
    dgamma.transpose().array() += dyi * xhat;
    dbeta.transpose().array() += dyi;
  }
}

/// Backward of layer_norm_forward from its saved mean and rstd: with xhat = (x - mean) rstd and g = dy * gamma,
/// dx = rstd (g - mean(g) - xhat mean(g xhat)) (assigned), dgamma += column sums of dy * xhat, dbeta += column
/// sums of dy (parameter gradients accumulate, as PyTorch's .grad does). dx may be the same memory as dy.
template <std::floating_point T>
void layer_norm_backward(const_matrix_ref<T> x, const_vector_ref<T> gamma, const_matrix_ref<T> dy,
                         const_vector_ref<T> mean, const_vector_ref<T> rstd, matrix_ref<T> dx, vector_ref<T> dgamma,
                         vector_ref<T> dbeta) {
  // The parameter gradients read dy before dx, which may share its memory, is written.
  layer_norm_backward_weight<T>(x, dy, mean, rstd, dgamma, dbeta);
  layer_norm_backward_input<T>(x, gamma, dy, mean, rstd, dx);
}

// -------------------------------------------------------------------------------------------------------- RMS norm

/// y = x * rsqrt(mean(x^2) + eps) * weight per row, as Llama's RMSNorm in Hugging Face transformers (which, for
/// float and double inputs, is this computation in the input's type). x, y [N, D]; weight [D]; rstd [N] is saved
/// for the backward. y may be the same memory as x.
template <std::floating_point T>
void rms_norm_forward(const_matrix_ref<T> x, const_vector_ref<T> weight, T eps, matrix_ref<T> y, vector_ref<T> rstd) {
  constexpr char const* fn = "rms_norm_forward";
  Eigen::Index const n = x.rows(), d = x.cols();
  detail::nn_check_norm(fn, d);
  detail::nn_check_size(fn, "weight [D]", weight, d);
  detail::nn_check_shape(fn, "y [N, D]", y, n, d);
  detail::nn_check_size(fn, "rstd [N]", rstd, n);
  for (Eigen::Index i = 0; i < n; ++i) {
    T const r = T(1) / std::sqrt(x.row(i).squaredNorm() / static_cast<T>(d) + eps);
    rstd(i) = r;
    y.row(i).array() = x.row(i).array() * r * weight.transpose().array();
  }
}

/// The input-gradient half of rms_norm_backward (a pipeline's B): dx alone, by the same expressions.
template <std::floating_point T>
void rms_norm_backward_input(const_matrix_ref<T> x, const_vector_ref<T> weight, const_matrix_ref<T> dy,
                             const_vector_ref<T> rstd, matrix_ref<T> dx) {
  constexpr char const* fn = "rms_norm_backward_input";
  Eigen::Index const n = x.rows(), d = x.cols();
  detail::nn_check_norm(fn, d);
  detail::nn_check_size(fn, "weight [D]", weight, d);
  detail::nn_check_shape(fn, "dy [N, D]", dy, n, d);
  detail::nn_check_size(fn, "rstd [N]", rstd, n);
  detail::nn_check_shape(fn, "dx [N, D]", dx, n, d);
  for (Eigen::Index i = 0; i < n; ++i) {
    auto const xhat = x.row(i).array() * rstd(i);
    auto const g = dy.row(i).array() * weight.transpose().array();
    T const gx_mean = (g * xhat).mean();
    dx.row(i).array() = (g - xhat * gx_mean) * rstd(i);
  }
}

/// The weight-gradient half of rms_norm_backward (a pipeline's W): dweight accumulated row by row, by the same
/// expression in the same order.
template <std::floating_point T>
void rms_norm_backward_weight(const_matrix_ref<T> x, const_matrix_ref<T> dy, const_vector_ref<T> rstd,
                              vector_ref<T> dweight) {
  constexpr char const* fn = "rms_norm_backward_weight";
  Eigen::Index const n = x.rows(), d = x.cols();
  detail::nn_check_shape(fn, "dy [N, D]", dy, n, d);
  detail::nn_check_size(fn, "rstd [N]", rstd, n);
  detail::nn_check_size(fn, "dweight [D]", dweight, d);
  for (Eigen::Index i = 0; i < n; ++i) dweight.transpose().array() += dy.row(i).array() * (x.row(i).array() * rstd(i));
}

/// Backward of rms_norm_forward from its saved rstd: with xhat = x rstd and g = dy * weight,
/// dx = rstd (g - xhat mean(g xhat)) (assigned), dweight += column sums of dy * xhat (accumulates, as PyTorch's
/// .grad does). dx may be the same memory as dy.
template <std::floating_point T>
void rms_norm_backward(const_matrix_ref<T> x, const_vector_ref<T> weight, const_matrix_ref<T> dy,
                       const_vector_ref<T> rstd, matrix_ref<T> dx, vector_ref<T> dweight) {
  rms_norm_backward_weight<T>(x, dy, rstd, dweight);  // before dx, which may share dy's memory, is written
  rms_norm_backward_input<T>(x, weight, dy, rstd, dx);
}

// --------------------------------------------------------------------------------------------------- cross-entropy

/// Mean cross-entropy of logits [N, V] against targets [N] over the targets that are not ignore_index, as
/// torch.nn.functional.cross_entropy(logits, targets, ignore_index=..., reduction='mean'); also writes dlogits
/// [N, V] = the gradient of that mean (rows of ignored targets are zero). Max-subtracted log-sum-exp, so large
/// logits do not overflow. dlogits may be the same memory as logits (saves a vocabulary-sized buffer).
/// When every target is ignored, torch returns NaN (0/0); this returns 0 with a zero gradient, so that a micro-batch
/// of padding adds nothing instead of poisoning the step. A target outside [0, V) that is not ignore_index throws.
/// Not covered: class weights, label smoothing, a vocabulary split across ranks (that needs the max and the sum of
/// exponentials reduced across the slices between the steps here).
/// `denominator` > 0 replaces the count of targets here (the sum of the losses divided by it: a share of a mean over
/// more tokens), and the gradient is then that share's times `gradient_factor` (sw::valid_tokens).
template <std::floating_point T>
T cross_entropy_forward_backward(const_matrix_ref<T> logits, std::span<const std::int64_t> targets,
                                 matrix_ref<T> dlogits, std::int64_t ignore_index = -100, double denominator = 0,
                                 double gradient_factor = 1) {
  constexpr char const* fn = "cross_entropy_forward_backward";
  Eigen::Index const n = logits.rows(), v = logits.cols();
  if (targets.size() != static_cast<std::size_t>(n))
    detail::fail("shardwise::nn::", fn, ": ", targets.size(), " targets for ", n, " rows of logits; give one per row");
  detail::nn_check_shape(fn, "dlogits [N, V]", dlogits, n, v);

  std::int64_t counted = 0;
  for (std::int64_t t : targets) {
    if (t == ignore_index) continue;
    if (t < 0 || t >= v)
      detail::fail("shardwise::nn::", fn, ": target ", t, " is outside [0, ", v, ") and is not ignore_index (",
                   ignore_index, ")");
    ++counted;
  }
  detail::check_within_step(counted, denominator, "shardwise::nn::", fn);
  if (counted == 0) {
    dlogits.setZero();
    return T(0);
  }

  T const inv_count = denominator > 0 ? static_cast<T>(gradient_factor / denominator) : T(1) / static_cast<T>(counted);
  // The sum of N losses in at least double: float would lose digits over a long sequence.
  using acc_t = std::common_type_t<T, double>;
  acc_t total = 0;
  for (Eigen::Index i = 0; i < n; ++i) {
    std::int64_t const t = targets[static_cast<std::size_t>(i)];
    if (t == ignore_index) {
      dlogits.row(i).setZero();
      continue;
    }
    T const max = logits.row(i).maxCoeff();
    T const target_logit = logits(i, t);  // read before an in-place dlogits overwrites it
    // One exp per logit: the exponentials go straight into dlogits, then their sum makes them the softmax.
    dlogits.row(i).array() = (logits.row(i).array() - max).exp();
    T const sum = dlogits.row(i).sum();
    total += static_cast<acc_t>(max + std::log(sum) - target_logit);
    dlogits.row(i) *= inv_count / sum;
    dlogits(i, t) -= inv_count;
  }
  return static_cast<T>(total / static_cast<acc_t>(denominator > 0 ? denominator : static_cast<double>(counted)));
}

}  // namespace shardwise::nn

// With SHARDWISE_SEPARATE_KERNELS defined, these kernels (and those of functional_elementwise.hpp) for float and double
// are declared here and compiled once, by the one file that includes <shardwise/compile_kernels.hpp> (CMake:
// link shardwise::separate_kernels), instead of in every file that calls them (docs/build-time.md).
#define SHARDWISE_DETAIL_FUNCTIONAL_KERNELS(prefix, T)                                                                 \
  prefix template void linear_forward<T>(const_matrix_ref<T>, const_matrix_ref<T>, std::optional<const_vector_ref<T>>, \
                                         matrix_ref<T>);                                                               \
  prefix template void linear_backward<T>(const_matrix_ref<T>, const_matrix_ref<T>, const_matrix_ref<T>,               \
                                          std::optional<matrix_ref<T>>, matrix_ref<T>, std::optional<vector_ref<T>>);  \
  prefix template void linear_backward_input<T>(const_matrix_ref<T>, const_matrix_ref<T>, matrix_ref<T>);              \
  prefix template void linear_backward_weight<T>(const_matrix_ref<T>, const_matrix_ref<T>, matrix_ref<T>,              \
                                                 std::optional<vector_ref<T>>);                                        \
  prefix template void embedding_forward<T>(std::span<const std::int64_t>, const_matrix_ref<T>, matrix_ref<T>,         \
                                            std::int64_t);                                                             \
  prefix template void embedding_backward<T>(std::span<const std::int64_t>, const_matrix_ref<T>, matrix_ref<T>,        \
                                             std::int64_t);                                                            \
  prefix template void layer_norm_forward<T>(const_matrix_ref<T>, const_vector_ref<T>, const_vector_ref<T>, T,         \
                                             matrix_ref<T>, vector_ref<T>, vector_ref<T>);                             \
  prefix template void layer_norm_backward<T>(const_matrix_ref<T>, const_vector_ref<T>, const_matrix_ref<T>,           \
                                              const_vector_ref<T>, const_vector_ref<T>, matrix_ref<T>, vector_ref<T>,  \
                                              vector_ref<T>);                                                          \
  prefix template void rms_norm_forward<T>(const_matrix_ref<T>, const_vector_ref<T>, T, matrix_ref<T>, vector_ref<T>); \
  prefix template void rms_norm_backward<T>(const_matrix_ref<T>, const_vector_ref<T>, const_matrix_ref<T>,             \
                                            const_vector_ref<T>, matrix_ref<T>, vector_ref<T>);                        \
  prefix template void layer_norm_backward_input<T>(const_matrix_ref<T>, const_vector_ref<T>, const_matrix_ref<T>,     \
                                                    const_vector_ref<T>, const_vector_ref<T>, matrix_ref<T>);          \
  prefix template void layer_norm_backward_weight<T>(const_matrix_ref<T>, const_matrix_ref<T>, const_vector_ref<T>,    \
                                                     const_vector_ref<T>, vector_ref<T>, vector_ref<T>);               \
  prefix template void rms_norm_backward_input<T>(const_matrix_ref<T>, const_vector_ref<T>, const_matrix_ref<T>,       \
                                                  const_vector_ref<T>, matrix_ref<T>);                                 \
  prefix template void rms_norm_backward_weight<T>(const_matrix_ref<T>, const_matrix_ref<T>, const_vector_ref<T>,      \
                                                   vector_ref<T>);                                                     \
  prefix template T cross_entropy_forward_backward<T>(const_matrix_ref<T>, std::span<const std::int64_t>,              \
                                                      matrix_ref<T>, std::int64_t, double, double);
#if defined(SHARDWISE_SEPARATE_KERNELS)
namespace shardwise::nn {
SHARDWISE_DETAIL_FUNCTIONAL_KERNELS(extern, float)
SHARDWISE_DETAIL_FUNCTIONAL_KERNELS(extern, double)
}  // namespace shardwise::nn
#endif

#pragma once
// A LoRA adapter of a Linear (Hu et al., peft's LoraLayer): y = x W^T + scale * (x A^T) B^T, with A [rank, in] and
// B [out, rank] cut as the weight is — A by the weight's input columns, B by its output rows — so that the adapter's
// output is a part of the product the layer's style already communicates: a rank's piece of a Colwise output, or a
// partial sum a Rowwise output reduces with the base's. Whichever factor the style leaves whole gets a partial
// gradient (each rank's sum over its piece), summed over tp by sw::finish_gradients. Compiled once per element
// type: what the style cuts comes in as two flags.
#include <Eigen/Core>
#include <cstddef>
#include <cstdint>

#include "shardwise/nn/kernels/functional_types.hpp"

namespace shardwise::detail {

/// The adapter's factors with their gradients; `*_pending`: a partial gradient before finish_gradients sums it.
template <class T>
struct lora_adapter {
  using matrix = nn::matrix<T>;
  matrix a, b;                  ///< A [rank, in] and B [out, rank]: this rank's pieces.
  matrix a_grad, b_grad;        ///< Their gradients (finished).
  matrix a_pending, b_pending;  ///< Partial gradients (the factor the style leaves whole), before the sum.
  T scale = T(1);               ///< alpha / rank (rsLoRA: alpha / sqrt(rank)).
  std::size_t rank = 0;         ///< r, kept apart: under FSDP a and b are freed between their unit's calls.
  bool a_partial = false, b_partial = false;  ///< Which factor's gradient is a partial sum over tp.

  /// y += scale * (x A^T) B^T, on the layer's product (before its style moves it).
  void add_to(matrix const& x, matrix& y) const {
    matrix const xa = x * a.transpose();
    y.noalias() += (scale * xa) * b.transpose();
  }

  /// Accumulates the factors' gradients from the product's input x and output gradient dy, and adds the adapter's
  /// part of the input gradient into dx (the product's, before the style's conjugate move).
  void backward(matrix const& x, matrix const& dy, matrix& dx) {
    // x A^T again rather than kept from forward: keeping it would be per-microbatch saved state on every Linear.
    matrix const xa = x * a.transpose();  // [tokens, rank]
    matrix const dxa = scale * (dy * b);  // [tokens, rank]
    matrix& db = b_partial ? b_pending : b_grad;
    matrix& da = a_partial ? a_pending : a_grad;
    if (db.rows() != b.rows() || db.cols() != b.cols()) db.setZero(b.rows(), b.cols());  // freed (FSDP) until now
    if (da.rows() != a.rows() || da.cols() != a.cols()) da.setZero(a.rows(), a.cols());
    db.noalias() += (scale * dy.transpose()) * xa;  // [out, rank]
    da.noalias() += dxa.transpose() * x;            // [rank, in]
    dx.noalias() += dxa * a;
  }

  void zero_grad() {
    a_grad.setZero(a.rows(), a.cols());
    b_grad.setZero(b.rows(), b.cols());
    a_pending.setZero(a_partial ? a.rows() : 0, a_partial ? a.cols() : 0);
    b_pending.setZero(b_partial ? b.rows() : 0, b_partial ? b.cols() : 0);
  }

  /// The adapter's product scale * B A, added into the weight it adapts (its piece of it): merging.
  void merge_into(matrix& weight) const { weight.noalias() += (scale * b) * a; }
};

}  // namespace shardwise::detail

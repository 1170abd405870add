#pragma once
// How a Linear multiplies: in its element type (the default), with a bf16 copy of its weight held for generation
// (sw::bf16_weights), or in bf16 for training (sw::bf16_autocast: the input, the weight and the output gradient
// rounded to bf16, each product summed in fp32; nn/kernels/bf16_gemm.hpp). The weights, their gradients and the
// optimizer's state stay in the element type: they are the master copies.
#include <cstddef>
#include <optional>
#include <string_view>
#include <type_traits>

#include "shardwise/core/error.hpp"
#include "shardwise/nn/kernels/bf16_gemm.hpp"
#include "shardwise/nn/kernels/bf16_weights.hpp"
#include "shardwise/nn/kernels/functional_types.hpp"

namespace shardwise::detail {

/// One layer's precision. A copied layer starts in its element type: the scope that set the original's resets only
/// the original.
template <class T>
class linear_precision {
  using matrix = nn::matrix<T>;

 public:
  linear_precision() = default;
  linear_precision(linear_precision const&) noexcept {}  // nothing of the original's: see above
  linear_precision& operator=(linear_precision const&) noexcept { return *this; }
  ~linear_precision() = default;

  /// Rounds `weight` (this rank's, `rows` x `cols` expected) into a copy the forward multiplies with.
  void hold_bf16_weight(matrix const& weight, Eigen::Index rows, Eigen::Index cols, std::string_view path) {
    require_float("bf16_weights", path);
    if (weight.rows() != rows || weight.cols() != cols)
      fail("shardwise::bf16_weights: the Linear at \"", path, "\" has no weight of its own here (", weight.rows(), "x",
           weight.cols(), " where its shard is ", rows, "x", cols,
           "): it is lazy and not materialized, or under sw::fully_shard; load the model first, and decode with bf16 "
           "weights on a model that is not fully sharded");
    if constexpr (std::is_same_v<T, float>) copy_ = to_bf16(weight);
    held_ = true;
  }
  /// Products in bf16 from now on (sw::bf16_autocast). `weight_resident`: the layer's weight is its own between
  /// its forward and its backward (not gathered for each, as under sw::fully_shard), so the forward's rounded copy is
  /// kept for the backward's dx rather than rounded again (2 bytes a weight while the scope lives).
  /// `scratch`: the scope's rounding buffers, which outlive this setting.
  void autocast(std::string_view path, bool weight_resident, bf16_scratch& scratch) {
    require_float("bf16_autocast", path);
    autocast_ = true, keep_rounded_weight_ = weight_resident, scratch_ = &scratch;
  }
  /// Back to products in T.
  void reset() {
    copy_ = {}, rounded_weight_ = {}, scratch_ = nullptr;
    held_ = autocast_ = keep_rounded_weight_ = false;
  }

  /// The bytes of a held copy (0 without one).
  [[nodiscard]] std::size_t bytes() const { return copy_.bytes(); }

  /// y = x W^T (+ bias) in this precision; false: the layer's own product in T is the one.
  bool forward(matrix const& x, matrix const& w, std::optional<nn::const_vector_ref<T>> bias, matrix& y) {
    if constexpr (std::is_same_v<T, float>) {
      if (held_) return bf16_weight_product(x, copy_, bias, y), true;
      if (!autocast_) return false;
      if (bias) y.rowwise() = bias->transpose();
      bf16_rows& rounded_x = scratch_->operand[0];
      round_into(rounded_x, x);
      // Every forward rounds the weight afresh (an optimizer step may have changed it); a backward uses the last.
      bf16_rows& rounded_w = keep_rounded_weight_ ? rounded_weight_ : scratch_->operand[1];
      round_into(rounded_w, w);
      bf16_gemm(rounded_x.view(), rounded_w.view().transposed(), y.data(), y.outerStride(), bias.has_value());
      return true;
    }
    return false;
  }
  /// dx = dy W in this precision; false: in T. Leaves dy rounded for a backward_weight that follows at once.
  bool backward_input(matrix const& w, matrix const& dy, matrix& dx) {
    if constexpr (std::is_same_v<T, float>) {
      if (!autocast_) return false;
      bf16_rows& rounded_dy = scratch_->operand[0];
      round_into(rounded_dy, dy);
      bf16_rows const* rounded_w = &rounded_weight_;  // a forward's, where one kept it
      if (!keep_rounded_weight_ || rounded_weight_.rows != w.rows() || rounded_weight_.cols != w.cols()) {
        round_into(scratch_->operand[1], w);
        rounded_w = &scratch_->operand[1];
      }
      bf16_gemm(rounded_dy.view(), rounded_w->view(), dx.data(), dx.outerStride(), false);
      return true;
    }
    return false;
  }
  /// weight_grad += dy^T x in this precision; false: in T. `dy_rounded`: backward_input has just rounded this dy
  /// and no product has run since (the step's B and W together; a pipeline's later W rounds its own).
  bool backward_weight(matrix const& x, matrix const& dy, matrix& weight_grad, bool dy_rounded) {
    if constexpr (std::is_same_v<T, float>) {
      if (!autocast_) return false;
      bf16_rows& rounded_dy = scratch_->operand[0];
      if (!dy_rounded) round_into(rounded_dy, dy);
      bf16_rows& rounded_x = scratch_->operand[1];
      round_into(rounded_x, x);
      bf16_gemm(rounded_dy.view().transposed(), rounded_x.view(), weight_grad.data(), weight_grad.outerStride(), true);
      return true;
    }
    return false;
  }

  /// A backward through a layer that computed with a held copy would train the weight on another product.
  void refuse_backward(std::string_view path) const {
    if (held_)
      fail("shardwise::Linear at \"", path,
           "\": backward while it computes with bf16 weights (an sw::bf16_weights lives); bf16 weights are for "
           "generation: end the sw::bf16_weights before training, or train under sw::bf16_autocast");
  }

 private:
  static void require_float(char const* scope, std::string_view path) {
    if constexpr (!std::is_same_v<T, float>)
      fail("shardwise::", scope, ": the Linear at \"", path, "\" holds ", sizeof(T) == 8 ? "double" : "non-float",
           " weights; bf16 products are for a model of float");
  }

  bf16_matrix copy_;
  bf16_rows rounded_weight_;         // under autocast, with a resident weight: the last forward's rounding, for dx
  bf16_scratch* scratch_ = nullptr;  // under autocast: the scope's buffers
  bool held_ = false, autocast_ = false, keep_rounded_weight_ = false;
};

}  // namespace shardwise::detail

#pragma once
// A Linear's output rows padded (a vocabulary's) and repeated (key-value heads over more ranks than heads): the
// members of linear_core (nn/layers/linear_core.hpp) that change its output rows, defined here.
#include "shardwise/nn/layers/linear_core.hpp"

namespace shardwise::detail {

template <class T, class Rule>
void linear_core<T, Rule>::pad_outputs(std::size_t out) {
  if (out <= out_) return;
  unpadded_out_ = out_;
  if (lazy_ || tied()) {  // a tied weight is padded by its owner
    out_ = local_out_ = out;
    return;
  }
  matrix padded = matrix::Zero(static_cast<Eigen::Index>(out), weight.cols());
  padded.topRows(weight.rows()) = weight;
  weight = std::move(padded);
  if (has_bias_) bias.conservativeResizeLike(vector::Zero(static_cast<Eigen::Index>(out)));
  out_ = out;
  zero_grad();
}

template <class T, class Rule>
void linear_core<T, Rule>::replicate_output_blocks(std::size_t block, std::size_t copies) {
  if (copies <= 1) return;
  if (block == 0 || out_ % block != 0 || copies_ != 1 || tied())
    fail("shardwise::Linear at \"", path_, "\": cannot repeat blocks of ", block, " output rows of ", out_,
         " (once, before parallelize, with a block size that divides the rows, on a weight it owns)");
  copies_ = copies;
  copy_block_ = block;
  if (lazy_) {
    out_ = local_out_ = out_ * copies;
    return;
  }
  auto const b = static_cast<Eigen::Index>(block), c = static_cast<Eigen::Index>(copies);
  matrix repeated(weight.rows() * c, weight.cols());
  vector repeated_bias(has_bias_ ? bias.size() * c : 0);
  for (Eigen::Index i = 0; i < weight.rows() / b; ++i)
    for (Eigen::Index k = 0; k < c; ++k) {
      repeated.middleRows((i * c + k) * b, b) = weight.middleRows(i * b, b);
      if (has_bias_) repeated_bias.segment((i * c + k) * b, b) = bias.segment(i * b, b);
    }
  weight = std::move(repeated);
  bias = std::move(repeated_bias);
  out_ = local_out_ = out_ * copies;
  zero_grad();
}

// Replicated blocks whose gradients were summed: keep the sum in each block's first copy and zero the others, so
// the next sum over copies counts it once.
template <class T, class Rule>
void linear_core<T, Rule>::unsum_copies() {
  copies_summed_ = false;
  std::size_t const first = group_ ? static_cast<std::size_t>(group_->rank()) * local_out_ : 0;
  for (std::size_t i = 0; i < local_out_; ++i)
    if (((first + i) / copy_block_) % copies_ != 0) {
      auto const row = static_cast<Eigen::Index>(i);
      if (weight_grad.rows() > row) weight_grad.row(row).setZero();  // a frozen weight has none
      if (has_bias_) bias_grad(row) = T(0);
      if (lora_) lora_->b_grad.row(row).setZero();
    }
}

}  // namespace shardwise::detail

#pragma once
// A Linear's weight rounded to bf16, held while an sw::bf16_weights lives: the layer's forward multiplies with it
// (nn/kernels/bf16_weights.hpp) instead of the fp32 weight, which stays as it was.
#include <cstddef>
#include <optional>
#include <string_view>
#include <type_traits>

#include "shardwise/core/error.hpp"
#include "shardwise/nn/kernels/bf16_weights.hpp"
#include "shardwise/nn/kernels/functional_types.hpp"

namespace shardwise::detail {

/// The bf16 copy of one layer's weight, or nothing. A copied layer starts without one: the sw::bf16_weights that
/// made it drops the original's only.
template <class T>
class bf16_weight_copy {
 public:
  bf16_weight_copy() = default;
  bf16_weight_copy(bf16_weight_copy const&) {}
  bf16_weight_copy& operator=(bf16_weight_copy const&) { return *this; }
  ~bf16_weight_copy() = default;

  /// Rounds `weight` (this rank's, `rows` x `cols` expected) into the copy; refuses a weight that is not here.
  void hold(nn::matrix<T> const& weight, Eigen::Index rows, Eigen::Index cols, std::string_view path) {
    if constexpr (!std::is_same_v<T, float>) {
      fail("shardwise::bf16_weights: the Linear at \"", path,
           "\" holds double weights; bf16 weights are for a model of float");
    } else {
      if (weight.rows() != rows || weight.cols() != cols)
        fail("shardwise::bf16_weights: the Linear at \"", path, "\" has no weight of its own here (", weight.rows(),
             "x", weight.cols(), " where its shard is ", rows, "x", cols,
             "): it is lazy and not materialized, or under sw::fully_shard; load the model first, and decode with "
             "bf16 weights on a model that is not fully sharded");
      copy_ = to_bf16(weight);
      held_ = true;
    }
  }
  void drop() { copy_ = {}, held_ = false; }
  [[nodiscard]] bool held() const { return held_; }
  [[nodiscard]] std::size_t bytes() const { return copy_.bytes(); }

  /// y = x W^T (+ bias) with the copy.
  void product(nn::matrix<T> const& x, std::optional<nn::const_vector_ref<T>> bias, nn::matrix<T>& y) const {
    if constexpr (std::is_same_v<T, float>) bf16_weight_product(x, copy_, bias, y);
  }

  /// A backward through a layer that computed with the copy would train the fp32 weight on the wrong product.
  void refuse_backward(std::string_view path) const {
    if (held_)
      fail("shardwise::Linear at \"", path,
           "\": backward while it computes with bf16 weights (an sw::bf16_weights lives); bf16 weights are for "
           "generation: end the sw::bf16_weights before training");
  }

 private:
  bf16_matrix copy_;
  bool held_ = false;
};

}  // namespace shardwise::detail

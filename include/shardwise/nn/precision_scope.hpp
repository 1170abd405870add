#pragma once
// What sw::bf16_weights and sw::bf16_autocast share: a scope that sets the precision of every Linear of a model
// (nn/layers/linear_precision.hpp) and puts each back to its element type when it ends, or when setting one fails.
#include <cstddef>
#include <string>

#include "shardwise/nn/kernels/bf16_gemm.hpp"
#include "shardwise/plan/tree.hpp"

namespace shardwise::detail {

/// Sets every Linear of a model through `set(layer, scratch)`, which returns the bytes the layer now holds for it, and
/// resets them all at its end. `scratch`: the scope's rounding buffers, which the Linears it sets may share.
template <module Model>
class linear_precision_scope {
 public:
  linear_precision_scope(linear_precision_scope const&) = delete;
  linear_precision_scope& operator=(linear_precision_scope const&) = delete;

  /// The Linears it set.
  [[nodiscard]] std::size_t layers() const { return layers_; }
  /// The bytes they hold for it on this rank (bf16 copies of their weights; 0 for bf16 products).
  [[nodiscard]] std::size_t bytes() const { return bytes_; }

 protected:
  /// Calls set(layer, scratch) on every Linear of `model`; where one refuses, resets those set before and throws on.
  template <class Set>
  linear_precision_scope(Model& model, Set&& set) : model_(model) {
    try {
      for_each_named_layer(model_, [&](auto& l, std::string const&) {
        if constexpr (requires { l.shardwise_reset_precision(); }) bytes_ += set(l, scratch_), ++layers_;
      });
    } catch (...) {
      reset();
      throw;
    }
  }
  ~linear_precision_scope() { reset(); }

 private:
  void reset() {
    for_each_named_layer(model_, [](auto& l, std::string const&) {
      if constexpr (requires { l.shardwise_reset_precision(); }) l.shardwise_reset_precision();
    });
  }

  Model& model_;
  bf16_scratch scratch_;
  std::size_t layers_ = 0, bytes_ = 0;
};

}  // namespace shardwise::detail

#pragma once
// sw::bf16_weights: while it lives, every Linear of a model multiplies with a bf16 copy of its weight (rounded to
// nearest even, as torch's .to(torch.bfloat16)), the input, the products and the sums staying fp32. A decode step,
// bound by reading the weights, reads half the bytes. The fp32 weights stay as they are; the copies take half their
// bytes more while the scope lives.
//
//   {
//     sw::bf16_weights const bf16(model);
//     auto g = sw::generate(model, tp, prompts);  // every Linear's product with its bf16 weight
//   }                                             // fp32 products again
#include <cstddef>
#include <string>

#include "shardwise/plan/tree.hpp"

namespace shardwise {

/// While it lives, every Linear of `model` (this rank's shard of it) multiplies with a bf16 copy of its weight, its
/// LoRA adapter and bias in fp32. A backward through such a layer is refused (the copies are for generation). Make
/// it after sw::parallelize and after loading, on every rank alike: a Linear with no weight here (lazy and not
/// materialized, or under sw::fully_shard) or of double is refused by name. The model must outlive it.
template <module Model>
class bf16_weights {
 public:
  /// Rounds every Linear's weight of `model` into its copy.
  explicit bf16_weights(Model& model) : model_(model) {
    try {
      detail::for_each_named_layer(model_, [&](auto& l, std::string const&) {
        if constexpr (requires { l.shardwise_hold_bf16_weight(true); }) {
          l.shardwise_hold_bf16_weight(true);
          bytes_ += l.bf16_weight_bytes(), ++layers_;
        }
      });
    } catch (...) {
      drop();
      throw;
    }
  }
  bf16_weights(bf16_weights const&) = delete;
  bf16_weights& operator=(bf16_weights const&) = delete;
  /// The Linears compute with their fp32 weights again.
  ~bf16_weights() { drop(); }

  /// The bytes of this rank's copies.
  [[nodiscard]] std::size_t bytes() const { return bytes_; }
  /// The Linears that compute with a copy.
  [[nodiscard]] std::size_t layers() const { return layers_; }

 private:
  void drop() {
    detail::for_each_named_layer(model_, [](auto& l, std::string const&) {
      if constexpr (requires { l.shardwise_hold_bf16_weight(false); }) l.shardwise_hold_bf16_weight(false);
    });
  }

  Model& model_;
  std::size_t bytes_ = 0, layers_ = 0;
};

}  // namespace shardwise

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
#include "shardwise/nn/precision_scope.hpp"

namespace shardwise {

/// While it lives, every Linear of `model` (this rank's shard of it) multiplies with a bf16 copy of its weight, its
/// LoRA adapter and bias in fp32. A backward through such a layer is refused (the copies are for generation). Make
/// it after sw::parallelize and after loading, on every rank alike: a Linear with no weight here (lazy and not
/// materialized, or under sw::fully_shard) or of double is refused by name. The model must outlive it. layers():
/// the Linears that compute with a copy; bytes(): this rank's copies.
template <module Model>
class bf16_weights : public detail::linear_precision_scope<Model> {
 public:
  /// Rounds every Linear's weight of `model` into its copy; the copies are dropped when it ends.
  explicit bf16_weights(Model& model)
      : detail::linear_precision_scope<Model>(model, [](auto& layer, detail::bf16_scratch&) {
          layer.shardwise_hold_bf16_weight();
          return layer.bf16_weight_bytes();
        }) {}
};

}  // namespace shardwise

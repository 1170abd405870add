#pragma once
// sw::bf16_autocast: while it lives, every Linear of a model multiplies in bf16, as torch.autocast("cpu",
// torch.bfloat16) does for nn.Linear: its input, its weight and (in backward) its output's gradient rounded to bf16,
// each product summed in fp32 (nn/kernels/bf16_gemm.hpp: oneDNN on the CPU's bf16 units where the program links
// shardwise::onednn). The outputs, the gradients, the weights and the optimizer's state stay fp32, the master copies;
// so do the norms, the attention's own products, the softmax and the loss.
//
//   sw::bf16_autocast const bf16(model);   // after parallelize (or fully_shard), before the first step
//   for (...) { model.forward(...); ...; model.backward(...); optimizer.step(); }
#include <cstddef>

#include "shardwise/nn/precision_scope.hpp"

namespace shardwise {

/// While it lives, every Linear of `model` multiplies in bf16 (forward and both backward products), under any
/// parallelism: each rank rounds its own shards. A Linear of double is refused by name. One such scope per model at a
/// time (sw::bf16_weights, for generation, is another); the model must outlive it. layers(): the Linears it set.
template <module Model>
class bf16_autocast : public detail::linear_precision_scope<Model> {
 public:
  /// Every Linear of `model` to bf16 products; fp32 again when it ends.
  explicit bf16_autocast(Model& model)
      : detail::linear_precision_scope<Model>(model, [](auto& layer, detail::bf16_scratch& scratch) {
          layer.shardwise_autocast_bf16(scratch);
          return std::size_t{0};
        }) {}
};

}  // namespace shardwise

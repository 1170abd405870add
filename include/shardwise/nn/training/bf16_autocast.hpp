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
#include <string>

#include "shardwise/plan/tree.hpp"

namespace shardwise {

/// While it lives, every Linear of `model` multiplies in bf16 (forward and both backward products), under any
/// parallelism: each rank rounds its own shards. A Linear of double is refused by name. One such scope per model at a
/// time (sw::bf16_weights, for generation, is another); the model must outlive it.
template <module Model>
class bf16_autocast {
 public:
  /// Every Linear of `model` to bf16 products.
  explicit bf16_autocast(Model& model) : model_(model) {
    try {
      detail::for_each_named_layer(model_, [&](auto& l, std::string const&) {
        if constexpr (requires { l.shardwise_autocast_bf16(true); }) l.shardwise_autocast_bf16(true), ++layers_;
      });
    } catch (...) {
      reset();
      throw;
    }
  }
  bf16_autocast(bf16_autocast const&) = delete;
  bf16_autocast& operator=(bf16_autocast const&) = delete;
  /// The Linears multiply in fp32 again.
  ~bf16_autocast() { reset(); }

  /// The Linears that multiply in bf16.
  [[nodiscard]] std::size_t layers() const { return layers_; }

 private:
  void reset() {
    detail::for_each_named_layer(model_, [](auto& l, std::string const&) {
      if constexpr (requires { l.shardwise_autocast_bf16(false); }) l.shardwise_autocast_bf16(false);
    });
  }

  Model& model_;
  std::size_t layers_ = 0;
};

}  // namespace shardwise

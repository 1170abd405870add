#pragma once
// The settings of sw::AdamW (nn/training/optim.hpp): torch.optim.AdamW's, with parameter groups, clipping, ZeRO-1
// and a learning-rate schedule.
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "shardwise/nn/training/schedule.hpp"

namespace shardwise {

/// A parameter group of AdamW, as torch.optim's param_groups: the parameters whose names `matches` accepts
/// take this weight decay (and learning rate, if set) instead of the options'. Every GPT and Llama recipe
/// exempts biases and norms: {.matches = sw::names_matching({"*.bias", "*norm.weight"}), .weight_decay = 0}.
template <class T>
struct AdamWGroup {
  std::function<bool(std::string_view name)> matches;  ///< Whether a parameter (by name) is in the group.
  T weight_decay = T(0);                               ///< The group's weight decay.
  std::optional<T> learning_rate = {};                 ///< The group's learning rate; unset: the options'.
};

/// The settings of AdamW, with torch.optim.AdamW's defaults.
template <class T>
struct AdamWOptions {
  T learning_rate = T(1e-3);  ///< The learning rate.
  /// The moments' decay rates, the denominator's epsilon and the decoupled weight decay, as torch.optim.AdamW's.
  /// @{
  T beta1 = T(0.9), beta2 = T(0.999), eps = T(1e-8), weight_decay = T(0.01);
  /// @}
  T max_grad_norm = T(0);  ///< Clip the global gradient norm to this; 0: no clipping.
  bool zero1 = false;      ///< ZeRO-1: shard the moments over data parallelism.
  /// Multiplies every group's learning rate, step by step (default: constant, no warm-up).
  LearningRateSchedule schedule = {};
  /// Parameter groups; a parameter takes the first group that matches its name, else the options above.
  std::vector<AdamWGroup<T>> groups = {};
};

}  // namespace shardwise

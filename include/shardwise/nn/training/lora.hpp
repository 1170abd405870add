#pragma once
// LoRA fine-tuning, as peft's LoraConfig + get_peft_model: adapters on the Linears whose names match the targets,
// everything else frozen; merge_lora folds them into the (sharded) weights. The adapters follow each Linear's style
// (nn/layers/lora.hpp), whatever style it is — the library's or a user's own.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "shardwise/core/error.hpp"
#include "shardwise/core/fold_hash.hpp"
#include "shardwise/nn/training/name_patterns.hpp"
#include "shardwise/nn/walk.hpp"
#include "shardwise/plan/module.hpp"

namespace shardwise {

/// What sw::add_lora adds, in peft's LoraConfig terms (lora_dropout 0, no bias adapters).
struct LoraConfig {
  std::size_t rank = 8;                     ///< r: the adapter's inner size.
  double alpha = 8;                         ///< lora_alpha: the scale is alpha / rank.
  std::vector<std::string> target_modules;  ///< Layer-name patterns ("layers.*.attention.w[qkvo]").
  bool use_rslora = false;                  ///< Scale alpha / sqrt(rank) instead (rsLoRA).
  std::uint64_t seed = 0x10a;               ///< A's draw (each layer's mixed with its name: any layout, same A).
};

/// The scale of an adapter of `config`: alpha / rank, or alpha / sqrt(rank) with use_rslora.
[[nodiscard]] inline double lora_scale(LoraConfig const& config) {
  double const rank = static_cast<double>(config.rank);
  return config.alpha / (config.use_rslora ? std::sqrt(rank) : rank);
}

namespace detail {
/// Freezes every parameter of `model` but its adapters (sw::freeze), as get_peft_model does.
template <module Model>
void freeze_all_but_adapters(Model& model) {
  for_each_parameter(model, [](std::string const&, auto const& p) {
    if (p.frozen && !p.leaf.starts_with("lora_")) *p.frozen = true;
  });
  zero_grad(model);  // the frozen gradients released
}
}  // namespace detail

/// Adds a LoRA adapter to every Linear of `model` whose name (its place in the model: "layers.0.attention.wq")
/// matches one of config.target_modules, and freezes every other parameter (sw::freeze), as get_peft_model does.
/// Call it after sw::parallelize (the adapters are cut as each weight is), on every rank alike, before the
/// optimizer's first step. A target that matches no Linear, or a rank of 0 or above a layer's smaller number of
/// features, is refused by name. Returns the number of adapters added.
template <module Model>
std::size_t add_lora(Model& model, LoraConfig const& config) {
  std::vector<bool> used(config.target_modules.size(), false);
  std::size_t added = 0;
  detail::for_each_named_layer(model, [&](auto& l, std::string const& path) {
    if constexpr (requires { l.shardwise_add_lora(std::size_t{}, {}, std::uint64_t{}); }) {
      bool target = false;
      for (std::size_t i = 0; i < used.size(); ++i)
        if (name_matches(config.target_modules[i], path)) target = used[i] = true;
      if (!target) return;
      using T = typename std::remove_cvref_t<decltype(l.weight)>::Scalar;
      l.shardwise_add_lora(config.rank, static_cast<T>(lora_scale(config)), detail::fold_hash(config.seed, path));
      ++added;
    }
  });
  for (std::size_t i = 0; i < used.size(); ++i)
    if (!used[i])
      detail::fail("shardwise::add_lora: the target \"", config.target_modules[i],
                   "\" matches no Linear of the model; targets match layer names such as \"layers.0.attention.wq\"");
  detail::freeze_all_but_adapters(model);
  return added;
}

/// Folds every adapter into its weight (W += scale * B A, each rank its own piece: nothing moves) and removes it;
/// the weights stay frozen (sw::freeze) as they were.
template <module Model>
void merge_lora(Model& model) {
  detail::for_each_named_layer(model, [](auto& l, std::string const&) {
    if constexpr (requires { l.shardwise_merge_lora(); }) l.shardwise_merge_lora();
  });
}

}  // namespace shardwise

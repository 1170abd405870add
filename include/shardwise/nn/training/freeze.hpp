#pragma once
// Frozen parameters: chosen by name pattern, they are not trained. Their layers skip the products that would give
// their gradients (a frozen Linear's backward computes only its input gradient), keep no gradient, optimizers keep
// no state for them, and finish_gradients, data parallelism and the optimizer's norm leave them out. Checkpoints
// still hold their values.
#include <cstddef>
#include <string>
#include <vector>

#include "shardwise/core/error.hpp"
#include "shardwise/nn/training/name_patterns.hpp"
#include "shardwise/nn/walk.hpp"
#include "shardwise/plan/module.hpp"

namespace shardwise {

/// Freezes every parameter of `model` whose name (sw::for_each_parameter's, "layers.0.attention.wq.weight")
/// matches one of `patterns` (sw::name_matches: "*" is any run of characters); a weight tied to a frozen one
/// (sw::tie_weights, or a pipeline stage's copy) is frozen with it. Call it on every rank alike, before the
/// optimizer's first step, and before sw::fully_shard (which then gathers frozen parameters for compute and never
/// reduces or steps them). A pattern that matches no parameter is refused, naming it. Returns the number of
/// parameters frozen.
template <module Model>
std::size_t freeze(Model& model, std::vector<std::string> const& patterns) {
  std::vector<bool> used(patterns.size(), false);
  auto const matching = [&](std::string const& name) {
    bool any = false;
    for (std::size_t i = 0; i < patterns.size(); ++i)
      if (name_matches(patterns[i], name)) any = used[i] = true;
    return any;
  };
  std::size_t frozen = 0;
  detail::for_each_named_layer(model, [&](auto& l, std::string const& path) {
    if constexpr (requires { l.shardwise_module_hooks(); })
      if (l.shardwise_module_hooks())
        detail::fail("shardwise::freeze: the layer at \"", path,
                     "\" is under sw::fully_shard, which sharded its parameters and their gradients as they were; "
                     "freeze before fully_shard");
    std::apply(
        [&](auto const&... p) {
          auto const one = [&](auto const& q) {
            std::string name = path.empty() ? std::string(q.leaf) : path + "." + std::string(q.leaf);
            if constexpr (requires { l.tied(); })
              if (q.leaf == "weight" && l.tied()) name = std::string(l.tied_to()) + ".weight";  // walked at its owner
            if (!q.mirror_of.empty()) name = std::string(q.mirror_of);
            if (!matching(name) || !q.frozen) return;
            *q.frozen = true;
            frozen += q.present ? 1 : 0;
          };
          (one(p), ...);
        },
        l.parameters());
  });
  for (std::size_t i = 0; i < patterns.size(); ++i)
    if (!used[i])
      detail::fail("shardwise::freeze: the pattern \"", patterns[i],
                   "\" matches no parameter of the model; patterns match the names sw::for_each_parameter gives "
                   "(\"layers.0.attention.wq.weight\", \"*norm.weight\")");
  zero_grad(model);  // frozen gradients released
  return frozen;
}

/// Elements of this rank's parameters that are trained (not frozen): what an optimizer keeps state for.
template <module Model>
[[nodiscard]] std::size_t trainable_elements(Model& model) {
  std::size_t n = 0;
  for_each_parameter(model, [&](std::string const&, auto const& p) {
    if (!detail::is_frozen(p)) n += static_cast<std::size_t>(p.value->size());
  });
  return n;
}

}  // namespace shardwise

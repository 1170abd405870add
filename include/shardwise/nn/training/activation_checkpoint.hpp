#pragma once
// Activation checkpointing: a module's forward keeps only its input; its backward runs the forward again from
// that input, then the backward. The recomputation is the same code on the same numbers, so the gradients are
// those without checkpointing, bit for bit; what is saved is memory (the module's activations between its
// forward and its backward), what is paid is one more forward (and its collectives, under tensor parallelism).
#include <utility>

#include "shardwise/nn/module_call.hpp"
#include "shardwise/plan/saved.hpp"

namespace shardwise {

/// What a checkpointed module keeps between its forward and its backward: its input only.
template <class X>
struct checkpointed_input {
  X input{};  ///< The module's input, kept for the recomputation.
};

/// The module's output for x (through sw::forward, so its plan entry applies; `context` goes to its forward after
/// x), keeping only x in `kept`: the activations the forward made are freed at once.
template <module Module, class X, class... Context>
constexpr auto checkpointed_forward(Module& module, X const& x, checkpointed_input<X>& kept,
                                    Context const&... context) {
  kept.input = x;
  auto y = forward(module, x, context...);
  drop_saved_activations(module);
  return y;
}

/// The module's input gradient for the output gradient dy: runs the forward again from `kept` (with the `context`
/// its forward was given), then the backward (through sw::backward); frees the kept input and the recomputed
/// activations afterwards.
template <module Module, class X, class DY, class... Context>
constexpr auto checkpointed_backward(Module& module, checkpointed_input<X>& kept, DY const& dy,
                                     Context const&... context) {
  detail::repeated_call const call(detail::meta_trace_of(dy));  // on shapes: recomputation and backward
  forward(module, kept.input, context...);
  auto dx = backward(module, dy);
  kept.input = X{};
  drop_saved_activations(module);
  return dx;
}

}  // namespace shardwise

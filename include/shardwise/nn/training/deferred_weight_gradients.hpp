#pragma once
// Zero-bubble pipeline schedules split a backward in two: B, which gives the input gradient the previous stage waits
// on, and W, the parameters' gradients, which can wait to fill the time a rank would idle. While a backward runs as B
// (sw::defer_weight_gradients alive on the module), a layer that can put its weight gradient off records that work
// instead of doing it; W runs the records in the order they were made, so every gradient accumulates in the order
// the whole backward would have accumulated it, bit for bit. Layers that record nothing compute their weight
// gradients in B, which is as correct and fills less. Where the work goes is state of the module's layers, set by
// the pipeline on the chunk it runs, not of the thread.
#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

#include "shardwise/plan/tree.hpp"

namespace shardwise {

/// The weight-gradient work (W) that layers put off during one backward run as B.
class deferred_weight_gradients {
 public:
  /// Records `work`, which must own (or outlive nothing but the layer it updates) what it reads.
  void defer(std::function<void()> work) { work_.push_back(std::move(work)); }
  /// Runs the work in the order it was recorded, then forgets it.
  void run() {
    for (auto& work : work_) work();
    work_.clear();
  }
  /// How many pieces of work are waiting.
  [[nodiscard]] std::size_t size() const { return work_.size(); }

 private:
  std::vector<std::function<void()>> work_;
};

namespace detail {
/// Points every layer under `node` that can put its weight gradient off (the library's layers) at `into`.
template <class Node>
void point_weight_work(Node& node, deferred_weight_gradients* into) {
  for_each_layer(node, [into](auto& l) {
    if constexpr (requires { l.shardwise_defer_weight_work(into); }) l.shardwise_defer_weight_work(into);
  });
}
}  // namespace detail

/// Where the backward of `node` (a module or a layer) records its weight-gradient work, or null when it should do
/// it now (outside a pipeline's B): what the first of its layers was pointed at. A module of your own with
/// parameters, or work of its own, may test it as Linear does:
/// `if (auto* later = sw::weight_gradients_deferred_to(*this)) later->defer([...] { ... }); else ...`.
template <class Node>
[[nodiscard]] deferred_weight_gradients* weight_gradients_deferred_to(Node& node) {
  deferred_weight_gradients* found = nullptr;
  bool first = true;
  detail::for_each_layer(node, [&](auto& l) {
    if constexpr (requires { l.shardwise_weight_work(); })
      if (first) found = l.shardwise_weight_work(), first = false;
  });
  return found;
}

/// While alive, the backward of `node`'s layers records their weight-gradient work into `into` (run_pipeline_step
/// arms it on a chunk around a backward_input action).
template <class Node>
class defer_weight_gradients {
 public:
  /// Arms `into` on every layer of `node`.
  defer_weight_gradients(Node& node, deferred_weight_gradients& into)
      : node_(node), previous_(weight_gradients_deferred_to(node)) {
    detail::point_weight_work(node_, &into);
  }
  ~defer_weight_gradients() { detail::point_weight_work(node_, previous_); }
  defer_weight_gradients(defer_weight_gradients const&) = delete;
  defer_weight_gradients& operator=(defer_weight_gradients const&) = delete;

 private:
  Node& node_;
  deferred_weight_gradients* previous_;
};

}  // namespace shardwise

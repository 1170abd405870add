#pragma once
// Zero-bubble pipeline schedules split a backward in two: B, which gives the input gradient the previous stage waits
// on, and W, the parameters' gradients, which can wait to fill the time a rank would idle. While a backward runs as B
// (sw::defer_weight_gradients alive on the thread), a layer that can put its weight gradient off records that work
// instead of doing it; W runs the records in the order they were made, so every gradient accumulates in the order
// the whole backward would have accumulated it, bit for bit. Layers that record nothing compute their weight
// gradients in B, which is as correct and fills less.
#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

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
inline deferred_weight_gradients*& weight_gradient_sink() {
  thread_local deferred_weight_gradients* sink = nullptr;  // each rank runs its backward on its own thread
  return sink;
}
}  // namespace detail

/// Where a layer's backward on this thread should record its weight-gradient work, or null when it should do it
/// now (outside a pipeline's B). A layer of your own with parameters may test it as Linear does:
/// `if (auto* later = sw::weight_gradients_deferred_to()) later->defer([...] { ... }); else ...`.
[[nodiscard]] inline deferred_weight_gradients* weight_gradients_deferred_to() {
  return detail::weight_gradient_sink();
}

/// While alive, backwards on this thread record their weight-gradient work into `into` (run_pipeline_step arms it
/// around a backward_input action).
class defer_weight_gradients {
 public:
  /// Arms `into` on this thread.
  explicit defer_weight_gradients(deferred_weight_gradients& into) : previous_(detail::weight_gradient_sink()) {
    detail::weight_gradient_sink() = &into;
  }
  ~defer_weight_gradients() { detail::weight_gradient_sink() = previous_; }
  defer_weight_gradients(defer_weight_gradients const&) = delete;
  defer_weight_gradients& operator=(defer_weight_gradients const&) = delete;

 private:
  deferred_weight_gradients* previous_;
};

}  // namespace shardwise

#pragma once
// RMSNorm over each attention head's slice of a projection's output (Qwen3's q_norm and k_norm): one weight of
// head_dim entries that every head shares. It works in the layout of the projection it follows: whole
// (Replicate), or cut by heads over tp (Shard<1>), where each rank normalizes its own heads and the weight's
// gradient is a partial sum over the ranks that sw::finish_gradients reduces (transformers' tp plan calls this
// "replicated_with_grad_allreduce"). The work is the norm's own (detail::norm_core) on the activation seen as
// [tokens * heads, head_dim], a view of the same storage.
#include <cstddef>
#include <type_traits>

#include "shardwise/nn/layers/norm.hpp"

namespace shardwise {

/// RMSNorm over each head_dim-wide slice of a [tokens, heads * head_dim] activation in layout Layout (Replicate,
/// or Shard<1>: this rank's heads), at its place in the plan (Location), which names no style of its own: the
/// cut is its projection's.
template <class T, class Location, class Layout>
class HeadRMSNorm : public detail::norm_core<T, Layout, detail::norm_kind::rms> {
  using core = detail::norm_core<T, Layout, detail::norm_kind::rms>;
  static_assert(std::is_same_v<Layout, Replicate> || std::is_same_v<Layout, Shard<1>>,
                "shardwise::HeadRMSNorm: a head norm follows a projection whose output is whole or cut by heads "
                "(Replicate or Shard<1>); give it the projection's output layout");
  static_assert(std::is_same_v<typename Location::style, NoParallel>,
                "shardwise::HeadRMSNorm: a per-head norm (q_norm, k_norm) is cut as the projection before it "
                "cuts the heads; leave it out of the plan");

 public:
  using shardwise_location = Location;                        ///< Its place in the plan.
  using shardwise_core = detail::core_of<HeadRMSNorm, core>;  ///< The class that holds its parameters.
  using style = NoParallel;                                   ///< It has no style of its own.

  /// A weight of `head_dim` ones; eps as the model's RMSNorm; `declared`: the module's sw::init (its mode only).
  constexpr HeadRMSNorm(std::size_t head_dim, T eps, init declared = {})
      : core(Location::path.view(), head_dim, eps, declared), head_dim_(head_dim) {}

  /// Forward on x [tokens, heads * head_dim] (this rank's heads under Shard<1>).
  constexpr Activation<T, Layout> operator()(Activation<T, Layout> x) {
    auto const tokens = x.local.rows(), width = x.local.cols();
    x.local.resize(tokens * heads_in(width), static_cast<std::ptrdiff_t>(head_dim_));
    Activation<T, Layout> y = this->forward_local(x.local);
    y.local.resize(tokens, width);
    return y;
  }

  /// Backward of the last forward: accumulates the weight's gradient and returns the input's.
  constexpr Activation<T, Layout> backward(Activation<T, Layout> dy) {
    auto const tokens = dy.local.rows(), width = dy.local.cols();
    dy.local.resize(tokens * heads_in(width), static_cast<std::ptrdiff_t>(head_dim_));
    Activation<T, Layout> dx = core::backward(dy);
    dx.local.resize(tokens, width);
    return dx;
  }

 private:
  [[nodiscard]] constexpr std::ptrdiff_t heads_in(std::ptrdiff_t width) const {
    auto const head = static_cast<std::ptrdiff_t>(head_dim_);
    if (width % head != 0)
      detail::fail("shardwise::HeadRMSNorm at \"", Location::path.view(), "\": an activation of width ", width,
                   " is not whole heads of ", head, "; give it the projection's output [tokens, heads * head_dim]");
    return width / head;
  }
  std::size_t head_dim_;
};

}  // namespace shardwise

#pragma once
// The model the module-boundary compile-fail tests share: a Model whose child "feed_forward" is a module with one
// Linear, "feed_forward.w1". Each test gives its own plan.
#include <shardwise/nn.hpp>

namespace one_module {
namespace sw = shardwise;
template <class T, class Plan>
struct FeedForward {
  sw::Linear<T, sw::layer_at<Plan, "w1">> w1;
  SHARDWISE_CHILDREN(w1)
  FeedForward() : w1(8, 8, 1) {}
  template <class X>
  auto forward(X const& x) {
    return w1(x);
  }
};
template <class T, class Plan>
struct Model {
  FeedForward<T, sw::subplan<Plan, "feed_forward">> feed_forward;
  SHARDWISE_CHILDREN(feed_forward)
};
}  // namespace one_module

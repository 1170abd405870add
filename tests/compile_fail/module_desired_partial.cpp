#include <shardwise/nn.hpp>
namespace sw = shardwise;
template <class T, class Plan>
struct FeedForward {
  sw::Linear<T, sw::style_at<Plan, "w1">> w1;
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
#ifdef SHARDWISE_SHOULD_FAIL
using desired = sw::Partial<sw::Sum>;  // a reduction is RowwiseParallel's output, not something a boundary makes
#else
using desired = sw::Replicate;
#endif
using plan = sw::plan<sw::at<"feed_forward", sw::PrepareModuleInput<sw::Shard<0>, desired>>>;
auto use(Model<float, plan>& model, sw::Activation<float, sw::Shard<0>> const& x) {
  return sw::forward(model.feed_forward, x);
}
